// Confined opens (see confined_file.h). Every check is made on an open descriptor, never on a
// name: readlink("/proc/self/fd/N") names the object the kernel really opened, whatever
// symlinks it followed on the way, and creations happen relative to a folder descriptor that
// was verified first.
#include "common/confined_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <system_error>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

std::mutex& RootsMutex() {
  static std::mutex mu;
  return mu;
}

std::shared_ptr<const FileRoots>& RootsSlot() {
  static std::shared_ptr<const FileRoots> roots = std::make_shared<const FileRoots>();
  return roots;
}

std::shared_ptr<const FileRoots> Roots() {
  std::lock_guard<std::mutex> lock(RootsMutex());
  return RootsSlot();
}

std::string Join(const std::vector<std::string>& roots, const char* sep) {
  std::string out;
  for (const std::string& r : roots) {
    if (!out.empty()) out += sep;
    out += r;
  }
  return out.empty() ? "none" : out;
}

Status PermissionDeniedError(std::string message) {
  return {StatusCode::kPermissionDenied, std::move(message)};
}

// The status of a failed system call on `path`, for the calls that report errors themselves.
Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  const std::string msg = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(msg);
  if (err == EACCES || err == EPERM) return PermissionDeniedError(msg);
  return InternalError(msg);
}

// What the kernel opened as `fd`: the target of /proc/self/fd/N.
StatusOr<std::string> DescriptorPath(int fd, const std::string& path) {
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  std::string buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink(link.c_str(), buf.data(), buf.size());
  if (n < 0 || static_cast<size_t>(n) >= buf.size()) {
    const int err = n < 0 ? errno : ENAMETOOLONG;
    return PermissionDeniedError(path + ": cannot tell what was opened (readlink " + link + ": " +
                                 std::strerror(err) +
                                 "), so it cannot be checked against the allowed roots (hint: "
                                 "confined ranks need /proc mounted)");
  }
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Status CheckWithin(const FileRoots& roots, int fd, const std::string& path, bool write) {
  if (!roots.confined) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(const std::string real, DescriptorPath(fd, path));
  auto inside = [&](const std::vector<std::string>& list) {
    for (const std::string& root : list) {
      if (PathIsWithin(real, root)) return true;
    }
    return false;
  };
  if (inside(roots.checkpoint) || (!write && inside(roots.data))) return OkStatus();
  const std::string allowed =
      write ? "the allowed checkpoint roots (" + Join(roots.checkpoint, ", ") + ")"
            : "the allowed data roots (" + Join(roots.data, ", ") + ") and checkpoint roots (" +
                  Join(roots.checkpoint, ", ") + ")";
  return PermissionDeniedError(
      path + ": opened " + real + ", which is outside " + allowed +
      " (hint: a folder or file on the path was replaced after the worker checked it, e.g. by "
      "a symlink; keep the roots writable only by the cluster's jobs)");
}

// "/a/b/c" → {"/a/b", "c"}; a path without a folder is in ".".
std::pair<std::string, std::string> SplitParent(const std::string& path) {
  const fs::path p(path);
  std::string parent = p.parent_path().string();
  if (parent.empty()) parent = ".";
  return {parent, p.filename().string()};
}

bool IsPlainLeaf(const std::string& leaf) {
  return !leaf.empty() && leaf != "." && leaf != ".." && leaf.find('/') == std::string::npos;
}

// Opens `dir` as a folder and verifies it. Returns -1 with errno set when it cannot be opened.
StatusOr<int> OpenVerifiedFolder(const FileRoots& roots, const std::string& dir, bool write) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (Status s = CheckWithin(roots, fd, dir, write); !s.ok()) {
    ::close(fd);
    return s;
  }
  return fd;
}

constexpr int kMaxRemoveDepth = 64;

// Removes `name` in the folder `dfd` and, for a folder, everything below it, never following a
// symlink (O_NOFOLLOW; a symlink is unlinked like a file).
Status RemoveEntry(int dfd, const std::string& name, const std::string& shown, int depth) {
  struct stat st;
  if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return OkStatus();
    return InternalError("cannot delete " + shown + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    if (depth >= kMaxRemoveDepth) {
      return InternalError("cannot delete " + shown + ": more than " +
                           std::to_string(kMaxRemoveDepth) + " levels of folders");
    }
    const int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return InternalError("cannot delete " + shown + ": " + std::strerror(errno));
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      const int err = errno;
      ::close(fd);
      return InternalError("cannot delete " + shown + ": " + std::strerror(err));
    }
    std::vector<std::string> children;
    while (const dirent* e = ::readdir(d)) {
      const std::string child = e->d_name;
      if (child != "." && child != "..") children.push_back(child);
    }
    Status status;
    for (const std::string& child : children) {
      status = RemoveEntry(::dirfd(d), child, shown + "/" + child, depth + 1);
      if (!status.ok()) break;
    }
    ::closedir(d);
    MESHRUN_RETURN_IF_ERROR(status);
    if (::unlinkat(dfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return InternalError("cannot delete " + shown + ": " + std::strerror(errno));
    }
    return OkStatus();
  }
  if (::unlinkat(dfd, name.c_str(), 0) != 0 && errno != ENOENT) {
    return InternalError("cannot delete " + shown + ": " + std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace

void InstallFileRoots(FileRoots roots) {
  auto installed = std::make_shared<const FileRoots>(std::move(roots));
  std::lock_guard<std::mutex> lock(RootsMutex());
  RootsSlot() = std::move(installed);
}

FileRoots InstalledFileRoots() {
  return *Roots();
}

Status CheckDescriptorWithinRoots(int fd, const std::string& path, bool write) {
  return CheckWithin(*Roots(), fd, path, write);
}

StatusOr<int> OpenConfined(const std::string& path, int flags, mode_t mode) {
  flags |= O_CLOEXEC;
  const std::shared_ptr<const FileRoots> roots = Roots();
  if (!roots->confined) return ::open(path.c_str(), flags, mode);
  const bool write = (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) != 0;
  if ((flags & O_CREAT) == 0) {
    const int fd = ::open(path.c_str(), flags, mode);
    if (fd < 0) return -1;
    if (Status s = CheckWithin(*roots, fd, path, write); !s.ok()) {
      ::close(fd);
      return s;
    }
    return fd;
  }
  // Created only inside a folder verified first, and never through a symlink at the leaf.
  const auto [parent, leaf] = SplitParent(path);
  if (!IsPlainLeaf(leaf)) {
    return InvalidArgumentError(path + ": not a file name to create (hint: name a file)");
  }
  MESHRUN_ASSIGN_OR_RETURN(const int dfd, OpenVerifiedFolder(*roots, parent, /*write=*/true));
  if (dfd < 0) return -1;
  const int fd = ::openat(dfd, leaf.c_str(), flags | O_NOFOLLOW, mode);
  const int err = errno;
  ::close(dfd);
  errno = err;
  return fd;
}

StatusOr<ConfinedName> ConfinedName::ForRead(const std::string& path) {
  if (!Roots()->confined) return ConfinedName(-1, path);
  MESHRUN_ASSIGN_OR_RETURN(const int fd, OpenConfined(path, O_RDONLY));
  if (fd < 0) return ErrnoStatus("cannot open for reading", path, errno);
  return ConfinedName(fd, "/proc/self/fd/" + std::to_string(fd));
}

ConfinedName::ConfinedName(ConfinedName&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), name_(std::move(other.name_)) {}

ConfinedName& ConfinedName::operator=(ConfinedName&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
  }
  return *this;
}

ConfinedName::~ConfinedName() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<int> RenameConfined(const std::string& from, const std::string& to) {
  const std::shared_ptr<const FileRoots> roots = Roots();
  if (!roots->confined) return ::rename(from.c_str(), to.c_str());
  const auto [from_dir, from_leaf] = SplitParent(from);
  const auto [to_dir, to_leaf] = SplitParent(to);
  if (from_dir != to_dir || !IsPlainLeaf(from_leaf) || !IsPlainLeaf(to_leaf)) {
    return InvalidArgumentError("cannot rename " + from + " to " + to +
                                " in a confined rank: both must name files of one folder");
  }
  MESHRUN_ASSIGN_OR_RETURN(const int dfd, OpenVerifiedFolder(*roots, to_dir, /*write=*/true));
  if (dfd < 0) return -1;
  const int rc = ::renameat(dfd, from_leaf.c_str(), dfd, to_leaf.c_str());
  const int err = errno;
  ::close(dfd);
  errno = err;
  return rc;
}

Status CreateDirectoriesConfined(const std::string& dir) {
  const std::shared_ptr<const FileRoots> roots = Roots();
  std::error_code ec;
  if (!roots->confined) {
    fs::create_directories(dir, ec);
    if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
    return OkStatus();
  }
  const fs::path full = fs::absolute(dir, ec).lexically_normal();
  if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
  // Walk down from "/", one verified descriptor at a time: a folder is made only inside a
  // folder already open and checked, so a component swapped for a symlink cannot redirect it.
  int fd = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return InternalError("cannot create " + dir + ": cannot open /");
  for (const fs::path& part : full.relative_path()) {
    const std::string name = part.string();
    if (name.empty() || name == ".") continue;
    int next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (next < 0 && errno == ENOENT) {
      if (Status s = CheckWithin(*roots, fd, dir, /*write=*/true); !s.ok()) {
        ::close(fd);
        return s;
      }
      if (::mkdirat(fd, name.c_str(), 0755) != 0 && errno != EEXIST) {
        const int err = errno;
        ::close(fd);
        return InternalError("cannot create " + dir + ": " + std::strerror(err));
      }
      next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    const int err = errno;
    ::close(fd);
    if (next < 0) return InternalError("cannot create " + dir + ": " + std::strerror(err));
    fd = next;
  }
  Status s = CheckWithin(*roots, fd, dir, /*write=*/true);
  ::close(fd);
  return s;
}

Status RemoveAllConfined(const std::string& path) {
  const std::shared_ptr<const FileRoots> roots = Roots();
  if (!roots->confined) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return InternalError("cannot delete " + path + ": " + ec.message());
    return OkStatus();
  }
  const auto [parent, leaf] = SplitParent(path);
  if (!IsPlainLeaf(leaf)) return InternalError("cannot delete " + path + ": not an entry name");
  MESHRUN_ASSIGN_OR_RETURN(const int dfd, OpenVerifiedFolder(*roots, parent, /*write=*/true));
  if (dfd < 0) {
    if (errno == ENOENT) return OkStatus();
    return InternalError("cannot delete " + path + ": " + std::strerror(errno));
  }
  Status s = RemoveEntry(dfd, leaf, path, 0);
  ::close(dfd);
  return s;
}

}  // namespace meshrun
