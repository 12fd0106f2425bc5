// LineSplitter (see line_splitter.h).
#include "supervisor/line_splitter.h"

#include <cstdint>

namespace meshrun {

void LineSplitter::Feed(std::string_view data, const std::function<void(std::string)>& on_line) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const size_t take = newline == std::string_view::npos ? data.size() : newline;
    partial_.append(data.substr(0, take));
    while (partial_.size() > max_line_) {
      on_line(partial_.substr(0, max_line_));
      partial_.erase(0, max_line_);
    }
    if (newline == std::string_view::npos) return;
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    on_line(std::move(partial_));
    partial_.clear();
    data.remove_prefix(newline + 1);
  }
}

void LineSplitter::Flush(const std::function<void(std::string)>& on_line) {
  if (partial_.empty()) return;
  on_line(std::move(partial_));
  partial_.clear();
}

void FrameSplitter::Feed(std::string_view data, const std::function<void(std::string)>& on_frame) {
  if (broken_) return;
  partial_.append(data);
  size_t at = 0;
  while (partial_.size() - at >= 4) {
    const auto* b = reinterpret_cast<const unsigned char*>(partial_.data() + at);
    const size_t length = static_cast<size_t>(b[0]) | (static_cast<size_t>(b[1]) << 8) |
                          (static_cast<size_t>(b[2]) << 16) | (static_cast<size_t>(b[3]) << 24);
    if (length > max_frame_) {
      broken_ = true;
      partial_.clear();
      return;
    }
    if (partial_.size() - at - 4 < length) break;
    on_frame(partial_.substr(at + 4, length));
    at += 4 + length;
  }
  partial_.erase(0, at);
}

std::string Frame(std::string_view payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(4 + payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload);
  return out;
}

}  // namespace meshrun
