// Fuzz target: checkpoint metadata (engine/io/checkpoint.h) from arbitrary bytes, and the
// checkpoint loader over it. Each input is parsed with ParseMetadata (what ReadMetadata does
// with metadata.json); an accepted one is then written as the metadata.json of a fixed step
// folder whose two shard files are real (tensor "w" [4, 6] split over ranks 0 and 1 by rows,
// "b" [6] on rank 0), and CheckComplete, FindLatestComplete, CheckpointReader::Open and
// ReadTensor run on it, as resume, eval and export do with a corrupt or hostile checkpoint.
// Properties: no crash, UB or runaway allocation; a rejected metadata.json is DATA_LOSS or
// FAILED_PRECONDITION; ReadTensor of a tensor the reader accepted either fills it or says why.
//
// With MESHRUN_FUZZ_WRITE_SEED=FILE set, the target writes the fixture's own metadata.json to
// FILE and exits (how fuzz/corpus/checkpoint_metadata/valid-two-shards.json was made).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "fuzz/fuzz_check.h"

namespace {

namespace fs = std::filesystem;
using meshrun::StatusCode;

struct Fixture {
  std::string root;      // the checkpoint.dir
  std::string step_dir;  // root/step-00000001
};

std::string ScratchBase() {
  if (const char* t = std::getenv("MESHRUN_FUZZ_TMPDIR")) return t;
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec)) return "/dev/shm";  // no disk writes per input
  return fs::temp_directory_path().string();
}

Fixture MakeFixture() {
  Fixture f;
  f.root = ScratchBase() + "/meshrun-fuzz-ckpt-" + std::to_string(::getpid());
  fs::remove_all(f.root);
  f.step_dir = meshrun::StepDir(f.root, 1);
  static const std::vector<float> w(24, 0.5f), b(6, 1.5f);
  meshrun::SliceRef w0{"w", {4, 6}, {0, 0}, {2, 6}, w.data()};
  meshrun::SliceRef w1{"w", {4, 6}, {2, 0}, {2, 6}, w.data() + 12};
  meshrun::SliceRef bias{"b", {6}, {0}, {6}, b.data()};
  meshrun::Status s = meshrun::WriteShard(f.step_dir, 0, {w0, bias});
  FUZZ_CHECK(s.ok(), "fixture: " + s.message());
  s = meshrun::WriteShard(f.step_dir, 1, {w1});
  FUZZ_CHECK(s.ok(), "fixture: " + s.message());
  meshrun::CheckpointMetadata m;
  m.step = 1;
  m.world_size = 2;
  m.mesh.dp_shard = 2;
  m.job_spec_yaml = "name: fuzz\n";
  m.trainer_json = R"({"data_position": 7})";
  s = meshrun::WriteMetadata(f.step_dir, m);
  FUZZ_CHECK(s.ok(), "fixture: " + s.message());
  return f;
}

const Fixture& GetFixture() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture(MakeFixture());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(GetFixture().root, ec);
    });
    return f;
  }();
  return *fixture;
}

// Number of elements of `shape`, or -1 when negative or above `cap`.
int64_t BoundedProduct(const std::vector<int64_t>& shape, int64_t cap) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > cap) return -1;
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const Fixture& f = GetFixture();
  if (const char* out = std::getenv("MESHRUN_FUZZ_WRITE_SEED")) {
    std::ifstream in(f.step_dir + "/" + meshrun::kCheckpointMetadataFile, std::ios::binary);
    std::ofstream(out, std::ios::binary) << in.rdbuf();
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = meshrun::ParseMetadata(text, "<fuzz>/metadata.json");
  if (!parsed.ok()) {
    const StatusCode code = parsed.status().code();
    FUZZ_CHECK(code == StatusCode::kDataLoss || code == StatusCode::kFailedPrecondition,
               parsed.status().message());
    return 0;
  }
  FUZZ_CHECK(!parsed->shards.empty(), "accepted metadata without shards");

  const Fixture& f = GetFixture();
  const std::string path = f.step_dir + "/" + meshrun::kCheckpointMetadataFile;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  // What resume does first; any answer is fine as long as it comes back.
  (void)meshrun::CheckComplete(f.step_dir, /*verify_crc=*/true);
  std::vector<std::string> warnings;
  (void)meshrun::FindLatestComplete(f.root, &warnings);

  auto reader = meshrun::CheckpointReader::Open(f.step_dir);
  if (!reader.ok()) return 0;
  for (const auto& [name, shape] : reader->metadata().tensors) {
    auto global = reader->GlobalShape(name);
    FUZZ_CHECK(global.ok() && *global == shape, name);
    const int64_t n = BoundedProduct(shape, 1 << 16);
    if (n < 0) continue;
    std::vector<float> out(static_cast<size_t>(n));
    const meshrun::Status s = reader->ReadTensor(name, out.data());
    FUZZ_CHECK(s.ok() || s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kOutOfRange,
               name + ": " + s.message());
  }
  return 0;
}
