// A stand-in for `meshrun __rank` in the worker's tests: reads its RankStart on stdin, leaves
// marks in its working folder (ran-R; env-R, its environment; start-R, what it was told; spec-R,
// the serialized spec it got),
// reports one step and one checkpoint on fd 3, prints one "env …" line, and then does what
// FAKE_RANK_MODE says: sleep (until SIGTERM, then exit 143), fail (exit 1), or bytes (a line
// and an error line that are not UTF-8, then exit 1).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "meshrun/v1/rank.pb.h"
#include "supervisor/line_splitter.h"

extern char** environ;

namespace {

volatile std::sig_atomic_t g_term = 0;
extern "C" void OnTerm(int) {
  g_term = 1;
}

void Report(const meshrun::v1::RankReport& report) {
  const std::string frame = meshrun::Frame(report.SerializeAsString());
  [[maybe_unused]] ssize_t n = write(3, frame.data(), frame.size());
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "-";
}

}  // namespace

int main() {
  std::string input;
  char buffer[4096];
  for (ssize_t n; (n = read(STDIN_FILENO, buffer, sizeof(buffer))) > 0;) input.append(buffer, n);
  meshrun::v1::RankStart start;
  bool parsed = false;
  meshrun::FrameSplitter frames;
  frames.Feed(input, [&](std::string frame) { parsed = start.ParseFromString(frame); });
  if (!parsed) {
    std::cerr << "error: no RankStart on stdin (" << input.size() << " bytes)" << std::endl;
    return 2;
  }
  const meshrun::v1::RankAssignment& a = start.assignment();
  const std::string r = std::to_string(a.rank());
  std::ofstream("ran-" + r) << "";
  {
    std::ofstream env("env-" + r);
    for (char** e = environ; *e != nullptr; ++e) env << *e << "\n";
  }
  std::ofstream("start-" + r) << "threads=" << start.threads() << "\n"
                              << "data_roots=" << start.file_roots().data_size() << "\n"
                              << "tls_ca=" << start.tls().ca() << "\n";

  // The spec as it arrived (decision 0048: the coordinator's bytes, forwarded unchanged).
  std::ofstream("spec-" + r, std::ios::binary) << a.spec().SerializeAsString();

  meshrun::v1::RankReport step;
  step.mutable_step()->set_step(1);
  step.mutable_step()->set_loss(5.5);
  step.mutable_step()->set_lr(0.001);
  Report(step);
  meshrun::v1::RankReport saved;
  saved.mutable_checkpoint_saved()->set_step(1);
  saved.mutable_checkpoint_saved()->set_path(std::string(getcwd(buffer, sizeof(buffer))) +
                                             "/ck/step-00000001");
  Report(saved);
  std::cout << "env " << a.rank() << " " << a.world_size() << " " << a.job_id() << " "
            << a.attempt() << " " << a.store().address() << " " << start.host() << " "
            << Env("OMP_NUM_THREADS") << " " << Env("MESHRUN_STORE_DIR") << std::endl;

  const std::string mode = Env("FAKE_RANK_MODE");
  if (mode == "sleep") {
    std::signal(SIGTERM, OnTerm);
    while (g_term == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::cerr << "stopping" << std::endl;
    return 143;
  }
  if (mode == "fail") {
    std::cerr << "error: rank blew up" << std::endl;
    return 1;
  }
  if (mode == "bytes") {
    std::cout << "raw \x9b[2J \xff ok \x1b[0m" << std::endl;
    std::cerr << "error: cut \xc3" << std::endl;
    return 1;
  }
  return 0;
}
