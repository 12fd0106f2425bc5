// `meshrun train --nproc N` of examples/tiny.yaml as the multi-process tests run it
// (pipeline_nproc_test.cc, shuffle_resume_test.cc): 6 steps with a checkpoint every 3 into a
// folder of the test's, real rank processes over Gloo on loopback, and the JSON lines it prints.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun::testing {

struct TinyTrainRun {
  CliResult cli;
  std::vector<nlohmann::json> steps;  // the step lines, in order
  std::vector<double> losses;         // their losses
  nlohmann::json summary;             // the summary line (null: none)
};

// `meshrun train -f examples/tiny.yaml --nproc NPROC -o json` for 6 steps, a checkpoint every 3
// in DIR/CKPT, `--set` of each of `sets` (KEY=VALUE), then the `extra` arguments as they are;
// stderr in DIR/CKPT.stderr, bounded by 120 s.
inline TinyTrainRun TrainTiny(const std::filesystem::path& dir, int nproc, const std::string& ckpt,
                              const std::vector<std::string>& sets = {},
                              const std::vector<std::string>& extra = {}) {
  const std::filesystem::path binary =
      std::filesystem::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun";
  const std::filesystem::path spec =
      std::filesystem::path(std::getenv("MESHRUN_SOURCE_DIR")) / "examples/tiny.yaml";
  std::vector<std::string> args = {"train",
                                   "-f",
                                   spec.string(),
                                   "--nproc",
                                   std::to_string(nproc),
                                   "-o",
                                   "json",
                                   "--set",
                                   "train.steps=6",
                                   "--set",
                                   "checkpoint.every=3",
                                   "--set",
                                   "checkpoint.dir=" + (dir / ckpt).string()};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  TinyTrainRun r;
  r.cli = RunCli(binary, args, dir / (ckpt + ".stderr"), 120);
  for (const std::string& line : Lines(r.cli.out)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("event", "") == "step") {
      r.losses.push_back(j["loss"]);
      r.steps.push_back(std::move(j));
    } else if (j.value("event", "") == "summary") {
      r.summary = std::move(j);
    }
  }
  return r;
}

}  // namespace meshrun::testing
