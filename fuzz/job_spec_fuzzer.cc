// Fuzz target: the YAML job spec reader (common/job_spec_yaml.h) on arbitrary text.
// Properties: ParseJobSpecYaml never crashes, throws or runs away (ASan, UBSan, libFuzzer's
// -timeout and -rss_limit_mb); a rejected spec is INVALID_ARGUMENT with a message (never
// INTERNAL: that is an exception that escaped the field readers); an accepted spec is valid
// (ValidateJobSpec) and round-trips: JobSpecToYaml, parsed again, gives the same spec.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using meshrun::StatusCode;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = meshrun::ParseJobSpecYaml(text, {}, "<fuzz>");
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == StatusCode::kInvalidArgument, spec.status().message());
    FUZZ_CHECK(!spec.status().message().empty(), "");
    return 0;
  }
  const meshrun::Status valid = meshrun::ValidateJobSpec(*spec, /*nproc=*/0);
  FUZZ_CHECK(valid.ok(), valid.message());
  const std::string yaml = meshrun::JobSpecToYaml(*spec);
  auto again = meshrun::ParseJobSpecYaml(yaml, {}, "<round trip>");
  FUZZ_CHECK(again.ok(), again.status().message() + "\n--- resolved spec:\n" + yaml);
  FUZZ_CHECK(*again == *spec, "--- resolved spec:\n" + yaml + "--- written again:\n" +
                                  meshrun::JobSpecToYaml(*again));
  return 0;
}
