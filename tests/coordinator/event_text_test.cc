// The coordinator keeps text it was sent as valid UTF-8 (a proto3 string that is not cannot be
// parsed by any client): a log line over the limit is cut between characters.
#include <gtest/gtest.h>

#include <string>

#include "coordinator/job_events.h"

namespace meshrun::coordinator {
namespace {

TEST(EventTextTest, ALongLogLineIsCutBetweenCharacters) {
  EventLimits limits;
  limits.max_log_line_bytes = 6;
  JobEventLog log("job-1", 1, limits);
  v1::JobEvent event;
  event.mutable_log()->set_text("abcde\xc3\xa9xyz");  // é straddles byte 6
  EXPECT_TRUE(log.Cut(&event));
  EXPECT_EQ(event.log().text(), std::string("abcde") + kLogCutMarker + "10 bytes]");
  v1::JobEvent whole;
  whole.mutable_log()->set_text("abcd\xc3\xa9xyz");  // é ends at byte 6
  EXPECT_TRUE(log.Cut(&whole));
  EXPECT_EQ(whole.log().text(), std::string("abcd\xc3\xa9") + kLogCutMarker + "9 bytes]");
}

}  // namespace
}  // namespace meshrun::coordinator
