#include "serialization/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

namespace zinf::serialization {
namespace {

// Calls `call` until it does not fail with EINTR; returns its result or -errno.
template <typename Call>
auto retry(Call call) -> decltype(call()) {
  for (;;) {
    const auto result = call();
    if (result >= 0) return result;
    if (errno != EINTR) return -errno;
  }
}

class PosixFileSystem final : public FileSystem {
 public:
  int open(const std::string& path, int flags, mode_t mode) override {
    return retry([&] { return ::open(path.c_str(), flags, mode); });
  }
  int64_t pwrite(int fd, const void* bytes, size_t length, uint64_t offset) override {
    return retry([&] {
      return static_cast<int64_t>(::pwrite(fd, bytes, length, static_cast<off_t>(offset)));
    });
  }
  int ftruncate(int fd, uint64_t size_bytes) override {
    return retry([&] { return ::ftruncate(fd, static_cast<off_t>(size_bytes)); });
  }
  int fsync(int fd) override {
    return retry([&] { return ::fsync(fd); });
  }
  int close(int fd) override { return ::close(fd) == 0 ? 0 : -errno; }
  int rename(const std::string& from, const std::string& to) override {
    return retry([&] { return ::rename(from.c_str(), to.c_str()); });
  }
  int exchange(const std::string& a, const std::string& b) override {
    return retry(
        [&] { return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE); });
  }
  int mkdir(const std::string& path, mode_t mode) override {
    return retry([&] { return ::mkdir(path.c_str(), mode); });
  }
  int unlink(const std::string& path) override {
    return retry([&] { return ::unlink(path.c_str()); });
  }
  int rmdir(const std::string& path) override {
    return retry([&] { return ::rmdir(path.c_str()); });
  }
};

std::atomic<FileSystem*> g_default{nullptr};

std::string parent_of(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

FileSystem& posix_file_system() noexcept {
  static PosixFileSystem* const posix = new PosixFileSystem;  // never destroyed: see header
  return *posix;
}

FileSystem& default_file_system() noexcept {
  FileSystem* const fs = g_default.load(std::memory_order_acquire);
  return fs != nullptr ? *fs : posix_file_system();
}

FileSystem* set_default_file_system(FileSystem* fs) noexcept {
  FileSystem* const previous = g_default.exchange(fs, std::memory_order_acq_rel);
  return previous != nullptr ? previous : &posix_file_system();
}

int sync_directory(FileSystem& fs, const std::string& path) {
  const int fd = fs.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return fd;
  const int synced = fs.fsync(fd);
  const int closed = fs.close(fd);
  return synced != 0 ? synced : closed;
}

int create_directories(FileSystem& fs, const std::string& path, std::string* failed) {
  // The missing folders, deepest first.
  std::vector<std::string> missing;
  std::string at = std::filesystem::path(path).lexically_normal().string();
  while (at.size() > 1 && at.back() == '/') at.pop_back();
  for (;;) {
    struct stat st;
    if (::stat(at.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) break;
      if (failed != nullptr) *failed = at;
      return -ENOTDIR;
    }
    if (errno != ENOENT) {
      const int error = -errno;
      if (failed != nullptr) *failed = at;
      return error;
    }
    missing.push_back(at);
    const std::string parent = parent_of(at);
    if (parent == at) break;
    at = parent;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    int rc = fs.mkdir(*it, 0777);
    // EEXIST: made meanwhile by another process, which may not have synced it yet.
    if (rc == 0 || rc == -EEXIST) rc = sync_directory(fs, parent_of(*it));
    if (rc != 0) {
      if (failed != nullptr) *failed = *it;
      return rc;
    }
  }
  return 0;
}

int remove_all(FileSystem& fs, const std::string& path, std::string* failed) {
  auto fail = [&](const std::string& at, int rc) {
    if (failed != nullptr) *failed = at;
    return rc;
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? 0 : fail(path, -errno);
  if (!S_ISDIR(st.st_mode)) {
    const int rc = fs.unlink(path);
    return rc == -ENOENT ? 0 : rc == 0 ? 0 : fail(path, rc);
  }
  std::vector<std::string> children;
  {
    std::error_code ec;
    std::filesystem::directory_iterator it(path, ec);
    if (ec) return fail(path, -ec.value());
    for (const std::filesystem::directory_entry& e : it) children.push_back(e.path().string());
  }
  for (const std::string& child : children) {
    const int rc = remove_all(fs, child, failed);
    if (rc != 0) return rc;
  }
  const int rc = fs.rmdir(path);
  return rc == -ENOENT ? 0 : rc == 0 ? 0 : fail(path, rc);
}

}  // namespace zinf::serialization
