// FUZZ_CHECK: the property a fuzz target asserts. A failed check prints what failed (and the
// status message, when given one) and aborts, which libFuzzer reports as a crash and saves the
// input as crash-<sha1>.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace meshrun::fuzz {

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition,
                                     const std::string& detail) {
  std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n%s%s", file, line, condition, detail.c_str(),
               detail.empty() ? "" : "\n");
  std::abort();
}

}  // namespace meshrun::fuzz

#define FUZZ_CHECK(condition, detail)                                                         \
  do {                                                                                        \
    if (!(condition)) ::meshrun::fuzz::CheckFailed(__FILE__, __LINE__, #condition, (detail)); \
  } while (0)
