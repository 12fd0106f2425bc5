// LineSplitter and FrameSplitter: a byte stream from a child process cut into whole lines (its
// stdout and stderr) or into length-prefixed messages (a rank's report channel,
// proto/meshrun/v1/rank.proto: a 4-byte little-endian length, then that many bytes).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace meshrun {

// Splits a byte stream into lines without their '\n' (and a trailing '\r'). A line longer than
// max_line bytes is cut into pieces of max_line. Not thread-safe; one per pipe.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 1 << 16) : max_line_(max_line) {}

  void Feed(std::string_view data, const std::function<void(std::string)>& on_line);
  // Hands out what is left after the last newline (at end of stream).
  void Flush(const std::function<void(std::string)>& on_line);

 private:
  size_t max_line_;
  std::string partial_;
};

// Cuts a stream of frames into their payloads. A frame announcing more than max_frame bytes
// marks the stream broken (broken() true; everything after is ignored). Not thread-safe.
class FrameSplitter {
 public:
  explicit FrameSplitter(size_t max_frame = 64 << 20) : max_frame_(max_frame) {}

  void Feed(std::string_view data, const std::function<void(std::string)>& on_frame);
  bool broken() const { return broken_; }
  // Bytes of an unfinished frame (non-zero at end of stream: the writer died mid-frame).
  size_t pending() const { return partial_.size(); }

 private:
  size_t max_frame_;
  bool broken_ = false;
  std::string partial_;
};

// The frame of `payload`: its length as 4 bytes little-endian, then the payload.
std::string Frame(std::string_view payload);

}  // namespace meshrun
