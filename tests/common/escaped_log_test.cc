// The log format of the daemons and the client (common/escaped_log.h): text a client, a worker
// or a rank sent cannot forge a line or reach the reader's terminal as escape sequences.
#include "common/escaped_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>
#include <string>

namespace meshrun {
namespace {

TEST(EscapedLogTest, TheDaemonsLogFormatEscapesTheMessage) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "escape-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::register_logger(logger);
  SetEscapedLogPattern("[%l] %*");
  logger->info("job {} cancelled: {}", "job-1", "bye\n[info] job-2 cancelled\x1b[2J\xc2\x9b\tok");
  spdlog::drop("escape-test");
  // One line: the forged one is part of it, the terminal controls are text; the tab stays.
  EXPECT_EQ(out.str(),
            "[info] job job-1 cancelled: bye\\x0a[info] job-2 cancelled\\x1b[2J\\u009b\tok\n");
}

}  // namespace
}  // namespace meshrun
