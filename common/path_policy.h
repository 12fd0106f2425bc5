// PathPolicy: the folders a job spec may name (docs/security.md "Confined paths", decision
// 0004). Data roots hold inputs; checkpoint roots hold what jobs write. Reads (data.train,
// data.val, model.init_from, a resume checkpoint) may come from either kind of root; writes
// (checkpoint.dir) only from a checkpoint root. No roots at all: unconfined.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"

namespace meshrun {

class PathPolicy {
 public:
  enum class Access { kRead, kWrite };
  // What ConfineJobSpec writes back into the spec.
  enum class Rewrite {
    kAbsolute,  // relative paths joined to their root; absolute ones left as named
    kReal,      // every path replaced by its resolved form (symlinks followed)
  };
  struct Resolved {
    std::string absolute;  // as named, joined to its root when relative, lexically normal
    std::string real;      // `absolute` with the symlinks of its existing prefix resolved
  };

  // Unconfined: every path is allowed and left as it is.
  PathPolicy() = default;
  // Roots made absolute (relative to the current directory) and resolved; they need not
  // exist. Errors name the flag: `--data-root: ...` (INVALID_ARGUMENT).
  static StatusOr<PathPolicy> Create(const std::vector<std::string>& data_roots,
                                     const std::vector<std::string>& checkpoint_roots);

  bool confined() const { return !data_roots_.empty() || !checkpoint_roots_.empty(); }
  const std::vector<std::string>& data_roots() const { return data_roots_; }
  const std::vector<std::string>& checkpoint_roots() const { return checkpoint_roots_; }

  // Resolves `path` (named by the spec field `field`, e.g. "data.train") and checks that it lies
  // in a root that allows `access`. A relative path is taken relative to the first such root
  // (data roots first for reads). Unconfined: {path, path}. Empty paths are not checked.
  // Errors (INVALID_ARGUMENT): `<field>: <path> is outside the allowed <kind> roots (<roots>)
  // (hint: ...)`, or a path that cannot be resolved.
  StatusOr<Resolved> Resolve(std::string_view field, const std::string& path, Access access) const;

  // Checks every path the spec names (data.train, data.val, data.tokenizer, model.init_from: reads;
  // checkpoint.dir: write) and rewrites them as `rewrite` says. Unconfined: no-op.
  Status ConfineJobSpec(JobSpec* spec, Rewrite rewrite) const;

  // "data roots [/data, /datasets], checkpoint roots [/ckpt]" or "unconfined", for start-up logs.
  std::string ToString() const;

 private:
  std::vector<std::string> data_roots_;        // resolved, absolute, no trailing slash
  std::vector<std::string> checkpoint_roots_;  // same
};

// True when `path` is `root` or lies below it, comparing whole components ("/data2" is not in
// "/data"). Both absolute and lexically normal.
bool PathIsWithin(const std::string& path, const std::string& root);

}  // namespace meshrun
