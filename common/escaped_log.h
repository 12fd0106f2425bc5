// The log format of meshrun's daemons and client: spdlog's pattern with the message escaped by
// EscapeText (common/escape.h), so that text a client, a worker or a rank sent (a reason, an
// error, a path, a name) cannot start a forged line or reach the reader's terminal as escape
// sequences, whichever log call quotes it. Header-only: for targets that link spdlog.
#pragma once

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "common/escape.h"

namespace meshrun {

// `%*` in a pattern: the message, escaped (tabs kept).
class EscapedMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        EscapeText(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedMessageFlag>();
  }
};

// Sets `pattern` (spdlog's syntax, with `%*` for the escaped message) on every registered
// logger and on those made later.
inline void SetEscapedLogPattern(const std::string& pattern) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<EscapedMessageFlag>('*').set_pattern(pattern);
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace meshrun
