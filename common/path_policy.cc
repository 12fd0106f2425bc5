// PathPolicy (see path_policy.h): lexical normalisation for the path as named, symlink
// resolution of its deepest existing prefix (std::filesystem::weakly_canonical) for the path
// that would really be opened, and a component-wise containment check of the latter.
#include "common/path_policy.h"

#include <cstdio>
#include <filesystem>
#include <functional>
#include <system_error>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

// Longer paths than this are refused outright (PATH_MAX on Linux).
constexpr size_t kMaxPathBytes = 4096;

// "/a/b/" → "/a/b"; "/" stays.
fs::path DropTrailingSlash(fs::path p) {
  while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p;
}

// `path` for an error message: control bytes as \xNN, cut at 512 bytes (long enough to show
// a real path whole, unlike EscapeForMessage's 80).
std::string PathForMessage(std::string_view path) {
  constexpr size_t kMax = 512;
  std::string out;
  for (size_t i = 0; i < path.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (path.size() > kMax) out += "...";
  return out;
}

std::string JoinRoots(const std::vector<std::string>& roots) {
  if (roots.empty()) return "none";
  std::string out;
  for (const std::string& r : roots) {
    if (!out.empty()) out += ", ";
    out += r;
  }
  return out;
}

StatusOr<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& roots,
                                                const std::string& flag) {
  std::vector<std::string> out;
  for (const std::string& root : roots) {
    // A newline would break the list a worker passes its ranks (common/confined_file.h).
    if (root.empty() || root.find('\0') != std::string::npos ||
        root.find('\n') != std::string::npos) {
      return InvalidArgumentError(flag + ": '" + PathForMessage(root) +
                                  "' is not a folder name (hint: pass an absolute folder, e.g. " +
                                  flag + " /data)");
    }
    std::error_code ec;
    fs::path p = fs::absolute(root, ec);
    if (!ec) p = fs::weakly_canonical(p, ec);
    if (ec) {
      return InvalidArgumentError(flag + ": cannot resolve '" + PathForMessage(root) +
                                  "': " + ec.message() + " (hint: check that it is readable)");
    }
    const std::string resolved = DropTrailingSlash(p.lexically_normal()).string();
    bool seen = false;
    for (const std::string& r : out) seen = seen || r == resolved;
    if (!seen) out.push_back(resolved);
  }
  return out;
}

// Entries of a folder the spec names (a text folder, an init_from folder, a checkpoint.dir and
// its step-* folders) are opened by the rank under that folder's path: a symlink among them
// must point inside the roots as well. Checks the folder's own entries and those of its
// sub-folders (not symlinked ones, whose target is checked instead), at most
// kMaxFolderEntries in all. Not a folder (or not there yet): OK.
constexpr size_t kMaxFolderEntries = 100'000;

Status CheckFolderLinks(const std::string& field, const std::string& dir,
                        const std::function<bool(const std::string&)>& inside,
                        const std::string& allowed, const std::string& hint) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return OkStatus();
  size_t seen = 0;
  std::vector<std::pair<fs::path, int>> todo = {{fs::path(dir), 0}};
  while (!todo.empty()) {
    const auto [folder, depth] = todo.back();
    todo.pop_back();
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      if (++seen > kMaxFolderEntries) {
        return InvalidArgumentError(
            field + ": " + PathForMessage(dir) + " holds more than " +
            std::to_string(kMaxFolderEntries) +
            " entries, too many to check for symlinks leaving the roots (hint: split it, or "
            "name a file)");
      }
      std::error_code entry_ec;
      if (it->is_symlink(entry_ec)) {
        const fs::path target = fs::weakly_canonical(it->path(), entry_ec);
        const std::string real = DropTrailingSlash(target.lexically_normal()).string();
        if (entry_ec || !inside(real)) {
          return InvalidArgumentError(field + ": " + PathForMessage(it->path().string()) +
                                      " is a symlink to " + PathForMessage(real) +
                                      ", which is outside " + allowed + " (" + hint + ")");
        }
      } else if (depth == 0 && it->is_directory(entry_ec)) {
        todo.push_back({it->path(), depth + 1});
      }
    }
    if (ec) {
      return InvalidArgumentError(field + ": cannot list " + PathForMessage(folder.string()) +
                                  ": " + ec.message() + " (hint: check that it is readable)");
    }
  }
  return OkStatus();
}

}  // namespace

bool PathIsWithin(const std::string& path, const std::string& root) {
  const fs::path p(path), r(root);
  auto pi = p.begin();
  for (auto ri = r.begin(); ri != r.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // a trailing separator of the root
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& data_roots,
                                        const std::vector<std::string>& checkpoint_roots) {
  PathPolicy policy;
  MESHRUN_ASSIGN_OR_RETURN(policy.data_roots_, ResolveRoots(data_roots, "--data-root"));
  MESHRUN_ASSIGN_OR_RETURN(policy.checkpoint_roots_,
                           ResolveRoots(checkpoint_roots, "--checkpoint-root"));
  return policy;
}

StatusOr<PathPolicy::Resolved> PathPolicy::Resolve(std::string_view field, const std::string& path,
                                                   Access access) const {
  if (!confined() || path.empty()) return Resolved{path, path};
  const std::string name(field);
  if (path.find('\0') != std::string::npos) {
    return InvalidArgumentError(name + ": the path contains a NUL byte (hint: name a file)");
  }
  if (path.size() > kMaxPathBytes) {
    return InvalidArgumentError(name + ": the path is " + std::to_string(path.size()) +
                                " bytes, longer than " + std::to_string(kMaxPathBytes) +
                                " (hint: use a shorter path)");
  }
  // Reads may come from any root, data roots first; writes only from checkpoint roots.
  std::vector<std::string> roots = checkpoint_roots_;
  if (access == Access::kRead) roots.insert(roots.begin(), data_roots_.begin(), data_roots_.end());
  const std::string allowed =
      access == Access::kRead
          ? "the allowed data roots (" + JoinRoots(data_roots_) + ") and checkpoint roots (" +
                JoinRoots(checkpoint_roots_) + ")"
          : "the allowed checkpoint roots (" + JoinRoots(checkpoint_roots_) + ")";
  const std::string hint =
      access == Access::kRead
          ? "hint: use a path under one of them; the cluster's operator adds roots with "
            "--data-root"
          : "hint: use a folder under one of them, or leave checkpoint.dir empty; the "
            "cluster's operator adds roots with --checkpoint-root";
  if (roots.empty()) {
    return InvalidArgumentError(name + ": " + PathForMessage(path) + " is outside " + allowed +
                                " (" + hint + ")");
  }

  fs::path joined(path);
  // A relative path is relative to the first root that allows the access (decision 0004).
  if (joined.is_relative()) joined = fs::path(roots.front()) / joined;
  Resolved out;
  out.absolute = DropTrailingSlash(joined.lexically_normal()).string();
  // weakly_canonical follows the symlinks of the existing prefix and applies `..` after them as
  // the kernel would; the rest (not yet existing) is normalised lexically.
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(joined, ec);
  if (ec) {
    return InvalidArgumentError(name + ": cannot resolve " + PathForMessage(path) + ": " +
                                ec.message() + " (hint: check that its folders are readable)");
  }
  out.real = DropTrailingSlash(real.lexically_normal()).string();
  auto inside = [&](const std::string& p) {
    for (const std::string& root : roots) {
      if (PathIsWithin(p, root)) return true;
    }
    return false;
  };
  if (inside(out.real)) {
    MESHRUN_RETURN_IF_ERROR(CheckFolderLinks(name, out.real, inside, allowed, hint));
    return out;
  }
  const std::string what = out.real == path ? PathForMessage(path)
                                            : PathForMessage(path) + " resolves to " +
                                                  PathForMessage(out.real) + ", which";
  return InvalidArgumentError(name + ": " + what + " is outside " + allowed + " (" + hint + ")");
}

Status PathPolicy::ConfineJobSpec(JobSpec* spec, Rewrite rewrite) const {
  if (!confined()) return OkStatus();
  struct Field {
    const char* name;
    std::string* path;
    Access access;
  };
  std::vector<std::string> source_names;  // "data.train[i]": each source of a mixture
  for (size_t i = 0; i < spec->data.train_sources.size(); ++i) {
    source_names.push_back("data.train[" + std::to_string(i) + "]");
  }
  std::vector<Field> fields = {
      {"data.train", &spec->data.train, Access::kRead},
      {"data.val", &spec->data.val, Access::kRead},
      {"data.tokenizer", &spec->data.tokenizer, Access::kRead},
      {"model.init_from", &spec->model.init_from, Access::kRead},
      {"checkpoint.dir", &spec->checkpoint.dir, Access::kWrite},
  };
  for (size_t i = 0; i < source_names.size(); ++i) {
    fields.push_back({source_names[i].c_str(), &spec->data.train_sources[i].path, Access::kRead});
  }
  // Check all before rewriting any, so that a refused spec is left as it was.
  std::vector<std::string> rewritten;
  for (const Field& f : fields) {
    MESHRUN_ASSIGN_OR_RETURN(Resolved r, Resolve(f.name, *f.path, f.access));
    rewritten.push_back(rewrite == Rewrite::kReal ? r.real : r.absolute);
  }
  for (size_t i = 0; i < rewritten.size(); ++i) *fields[i].path = std::move(rewritten[i]);
  return OkStatus();
}

std::string PathPolicy::ToString() const {
  if (!confined()) return "unconfined";
  return "data roots [" + JoinRoots(data_roots_) + "], checkpoint roots [" +
         JoinRoots(checkpoint_roots_) + "]";
}

}  // namespace meshrun
