// Confined opens: the rank's half of path confinement (docs/security.md "Confined paths",
// decision 0011). The worker checks a spec's paths by name; these calls check the object a rank
// really opens (through the descriptor, via /proc/self/fd) so a symlink swapped in afterwards
// cannot lead outside the roots. Creations, renames and deletions go through a verified folder.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/path_policy.h"
#include "common/status.h"

namespace meshrun {

// The roots the worker confines its ranks to, as the rank sees them: data roots and checkpoint
// roots may be read, checkpoint roots written. Resolved, absolute, no trailing slash.
struct FileRoots {
  bool confined = false;  // false: every call below is its plain POSIX counterpart
  std::vector<std::string> data;
  std::vector<std::string> checkpoint;
};

// Process-wide roots, installed once at rank start (before the engine opens anything) from the
// RankStart's file_roots, which meshrun-worker fills from its --data-root and --checkpoint-root
// (rank/rank_main.h, InstallRankFileRoots), and read by every call below. Thread-safe. Default:
// unconfined.
void InstallFileRoots(FileRoots roots);
FileRoots InstalledFileRoots();

// open(2) confined. Returns the descriptor, or -1 with errno set when the open itself failed (the
// caller reports that as before), or PERMISSION_DENIED when the object opened lies outside the
// roots (then nothing stays open). Reads (O_RDONLY without O_CREAT/O_TRUNC) may come from any
// root; anything else only from a checkpoint root. With O_CREAT the parent folder is opened and
// verified first and the leaf is created in it with O_NOFOLLOW, so nothing is created outside.
// Unconfined: plain open(2). O_CLOEXEC is always added.
StatusOr<int> OpenConfined(const std::string& path, int flags, mode_t mode = 0644);

// A name that opens the same object as `path` did when it was checked, for APIs that take names
// (std::ifstream): "/proc/self/fd/N" of a verified descriptor held while this lives. Unconfined,
// or when `path` cannot be opened: `path` itself (the caller's own open then fails as before).
class ConfinedName {
 public:
  static StatusOr<ConfinedName> ForRead(const std::string& path);
  ConfinedName(ConfinedName&& other) noexcept;
  ConfinedName& operator=(ConfinedName&& other) noexcept;
  ConfinedName(const ConfinedName&) = delete;
  ConfinedName& operator=(const ConfinedName&) = delete;
  ~ConfinedName();
  const std::string& name() const { return name_; }

 private:
  ConfinedName(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  int fd_ = -1;
  std::string name_;
};

// rename(2) of `from` to `to`, both in one folder (an atomic write's temporary and its final
// name): done with renameat on that folder's verified descriptor. Returns 0, or -1 with errno
// set, or PERMISSION_DENIED when the folder lies outside the checkpoint roots.
StatusOr<int> RenameConfined(const std::string& from, const std::string& to);

// std::filesystem::create_directories, each component opened and verified before anything is
// created in it. Errors: INTERNAL "cannot create DIR: …", PERMISSION_DENIED outside the roots.
Status CreateDirectoriesConfined(const std::string& dir);

// std::filesystem::remove_all of `path`, done below its verified parent folder with openat,
// unlinkat and O_NOFOLLOW (symlinks are removed, never followed). Errors: INTERNAL "cannot
// delete PATH: …", PERMISSION_DENIED outside the checkpoint roots.
Status RemoveAllConfined(const std::string& path);

// Checks that the open descriptor `fd` (opened as `path`) lies in the roots for `write` or
// read access: readlink of /proc/self/fd/N against the installed roots. Unconfined: OK.
Status CheckDescriptorWithinRoots(int fd, const std::string& path, bool write);

}  // namespace meshrun
