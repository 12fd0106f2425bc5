// Runs the built `meshrun` binary as a real process for the client tests: stdout through a
// pipe, stderr through a file, every run bounded by coreutils `timeout`.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace meshrun::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::string ShellQuote(const std::string& arg) {
  std::string quoted = "'";
  for (char ch : arg) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Runs `binary args...` with a wall-clock bound; stderr goes to `err_path`.
inline CliResult RunCli(const std::filesystem::path& binary, const std::vector<std::string>& args,
                        const std::filesystem::path& err_path, int timeout_seconds = 30) {
  std::string command = "timeout " + std::to_string(timeout_seconds) + " ";
  command += ShellQuote(binary.string());
  for (const std::string& arg : args) {
    command += ' ';
    command += ShellQuote(arg);
  }
  command += " 2>";
  command += ShellQuote(err_path.string());
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  return result;
}

// The model venv's python (current torch, numpy, transformers, tokenizers from PyPI; made by
// tests/python/make-venv into MESHRUN_BINARY_DIR/model-venv, which scripts/test starts while the
// build runs): make-venv waits for a concurrent maker (its lock) and reuses a made venv. Empty,
// with `why`, when it cannot be made (no python3-venv, PyPI unreachable): the caller skips.
inline std::filesystem::path ModelVenvPython(const std::filesystem::path& source_dir,
                                             std::string* why) {
  const char* binary_dir = std::getenv("MESHRUN_BINARY_DIR");
  const std::filesystem::path build = binary_dir != nullptr ? binary_dir : "build";
  const std::filesystem::path venv = build / "model-venv";
  const std::filesystem::path log = build / "model-venv.make.log";
  CliResult r = RunCli(
      source_dir / "tests" / "python" / "make-venv",
      {venv.string(), (source_dir / "tests/python/requirements-models.txt").string()}, log, 1500);
  if (r.exit_code != 0) {
    *why = "the model venv could not be made (exit " + std::to_string(r.exit_code) +
           "; tests/python/make-venv): " + ReadFile(log);
    return {};
  }
  return venv / "bin" / "python";
}

// A fixture for tests of the built `meshrun`: binary_ (MESHRUN_BINARY_DIR/bin/meshrun, set by
// ctest), source_ (the source tree) and temp_ (a fresh folder, removed afterwards).
class MeshrunBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary_dir = std::getenv("MESHRUN_BINARY_DIR");
    const char* source_dir = std::getenv("MESHRUN_SOURCE_DIR");
    ASSERT_NE(binary_dir, nullptr) << "run through ctest (sets MESHRUN_BINARY_DIR)";
    binary_ = std::filesystem::path(binary_dir) / "bin" / "meshrun";
    source_ = source_dir ? std::filesystem::path(source_dir) : std::filesystem::current_path();
    ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_;
    char pattern[] = "/tmp/meshrun_cli_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    if (!temp_.empty()) std::filesystem::remove_all(temp_, ec);
  }

  std::filesystem::path binary_, source_, temp_;
};

}  // namespace meshrun::testing
