// FileCache (see aio/file_cache.h).
#include "aio/file_cache.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "aio/error.h"

namespace zinf::aio {
namespace {

std::atomic<OpenFunction> g_open_function{nullptr};

// open(2) (or the test seam) with EINTR retried; returns the fd or -errno.
int open_retry(const std::string& path, int flags) {
  if (OpenFunction function = g_open_function.load(std::memory_order_acquire)) {
    return function(path.c_str(), flags | O_CLOEXEC, 0644);
  }
  for (;;) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

void set_open_function_for_testing(OpenFunction function) {
  g_open_function.store(function, std::memory_order_release);
}

std::shared_ptr<const FileEntry> FileCache::get(const std::string& path, bool writable) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(path);
  if (it != files_.end() && (it->second->writable || !writable)) return it->second;
  std::shared_ptr<const FileEntry> entry = open_entry(path, writable);
  files_[path] = entry;
  return entry;
}

void FileCache::close(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  files_.erase(path);
}

std::vector<std::string> FileCache::buffered_paths() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffered_;
}

std::shared_ptr<const FileEntry> FileCache::open_entry(const std::string& path, bool writable) {
  auto entry = std::make_shared<FileEntry>();
  entry->path = path;
  entry->writable = writable;
  const int flags = writable ? (O_RDWR | O_CREAT) : O_RDONLY;
  int fd = open_retry(path, flags | O_DIRECT);
  if (fd == -EINVAL) {
    fd = open_retry(path, flags);
    if (fd >= 0) {
      entry->direct = false;
      if (std::find(buffered_.begin(), buffered_.end(), path) == buffered_.end()) {
        buffered_.push_back(path);
        spdlog::warn("aio: '{}' does not support O_DIRECT; using buffered I/O for it", path);
      }
    }
  }
  if (fd < 0) {
    throw IoError("open", path, 0, 0, -fd,
                  writable ? "opening for writing" : "opening for reading");
  }
  entry->fd = UniqueFd(fd);
  if (writable && entry->direct) {
    const int buffered = open_retry(path, flags);
    if (buffered < 0) throw IoError("open", path, 0, 0, -buffered, "buffered descriptor");
    entry->buffered_fd = UniqueFd(buffered);
  }
  return entry;
}

}  // namespace zinf::aio
