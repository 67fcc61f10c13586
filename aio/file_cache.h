// FileCache: the open file descriptors of an AioHandle, keyed by path.
//
// A file is opened with O_DIRECT; when the filesystem refuses it (EINVAL, e.g. tmpfs) it is
// reopened buffered, one warning line is logged and the path is remembered. Writable files
// also get a second, buffered descriptor: writes of partial 4096-byte blocks go through it,
// so the page cache merges them (exact file size, no read-modify-write races between
// neighbouring writes). Entries are immutable and shared: a transfer holds its entry until
// it ends, so close()/upgrades never pull a descriptor from under a request in flight.
//
// Thread safety: all methods are thread-safe (one mutex).
#pragma once

#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zinf::aio {

// Test seam: replaces open(2) for every FileCache of the process (nullptr restores it). The
// function returns a descriptor or -errno. Lets tests refuse O_DIRECT on a filesystem that
// accepts it (tmpfs does since Linux 6.6). Set it only while no handle is opening files.
using OpenFunction = int (*)(const char* path, int flags, unsigned mode);
void set_open_function_for_testing(OpenFunction function);

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);  // the fd is gone even when close reports an error
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct FileEntry {
  std::string path;
  UniqueFd fd;           // O_DIRECT unless `direct` is false
  UniqueFd buffered_fd;  // writable direct files only: for partial-block writes
  bool direct = true;
  bool writable = false;
};

class FileCache {
 public:
  FileCache() = default;
  FileCache(const FileCache&) = delete;
  FileCache& operator=(const FileCache&) = delete;

  // The entry for `path`, opened for reading (and writing, creating the file with mode 0644,
  // when `writable`). Throws IoError("open", path, ...) on failure.
  std::shared_ptr<const FileEntry> get(const std::string& path, bool writable);
  // Drops the cached entry (its fds close once no transfer holds it).
  void close(const std::string& path);
  std::vector<std::string> buffered_paths() const;

 private:
  std::shared_ptr<const FileEntry> open_entry(const std::string& path, bool writable);

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const FileEntry>> files_;  // guarded
  std::vector<std::string> buffered_;                                        // guarded
};

}  // namespace zinf::aio
