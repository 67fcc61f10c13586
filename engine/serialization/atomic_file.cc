#include "engine/serialization/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "engine/serialization/serialization_error.h"

namespace zinf::serialization {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

std::string errno_text(const std::string& op, int error) {
  return op + " failed: " + std::strerror(error);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // Not mkstemp: its files are mode 0600, and the file keeps its temporary file's mode after
  // the rename. Opened with 0666 the file gets the mode the umask gives any new file.
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  int error = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%06x%04x", random() & 0xFFFFFFu,
                  static_cast<unsigned>(counter.fetch_add(1) & 0xFFFF));
    std::string candidate = path_ + suffix;
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      temp_path_ = std::move(candidate);
      buffer_.reserve(kBufferBytes);
      return;
    }
    error = errno;
    if (error != EEXIST && error != EINTR) {
      throw SerializationError(candidate, kNoOffset, errno_text("open", error));
    }
  }
  throw SerializationError(path_ + ".tmp.*", kNoOffset, errno_text("open", error));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);  // an error here changes nothing: the file is removed below
  }
  if (!committed_) {
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFile::fail(uint64_t offset, const std::string& what) {
  failed_ = true;
  throw SerializationError(temp_path_, offset, what);
}

void AtomicFile::check_usable() const {
  if (committed_) {
    throw SerializationError(path_, kNoOffset, "file already committed");
  }
  if (failed_) {
    throw SerializationError(temp_path_, kNoOffset, "an earlier write to this file failed");
  }
}

void AtomicFile::pwrite_all(const uint8_t* bytes, uint64_t length, uint64_t offset) {
  while (length > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(length, uint64_t{1} << 30));
    const ssize_t done = ::pwrite(fd_, bytes, chunk, static_cast<off_t>(offset));
    if (done < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      fail(offset, errno_text("pwrite of " + std::to_string(chunk) + " bytes", error));
    }
    if (done == 0) {
      fail(offset, "pwrite of " + std::to_string(chunk) + " bytes made no progress");
    }
    bytes += done;
    length -= static_cast<uint64_t>(done);
    offset += static_cast<uint64_t>(done);
  }
}

void AtomicFile::flush() {
  pwrite_all(buffer_.data(), buffer_.size(), buffer_offset_);
  buffer_.clear();
  buffer_offset_ = offset_;
}

void AtomicFile::append(std::span<const uint8_t> bytes) {
  check_usable();
  if (bytes.size() >= kBufferBytes) {
    flush();
    pwrite_all(bytes.data(), bytes.size(), offset_);
    offset_ += bytes.size();
    buffer_offset_ = offset_;
    return;
  }
  if (buffer_.size() + bytes.size() > kBufferBytes) {
    flush();
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  offset_ += bytes.size();
}

void AtomicFile::skip(uint64_t count) {
  check_usable();
  flush();
  offset_ += count;
  buffer_offset_ = offset_;
}

void AtomicFile::patch(uint64_t offset, std::span<const uint8_t> bytes) {
  check_usable();
  if (offset > offset_ || bytes.size() > offset_ - offset) {
    throw SerializationError(
        temp_path_, offset,
        "patch of " + std::to_string(bytes.size()) + " bytes past the end of what was written");
  }
  // The part inside the buffer is patched there, the part before it in the file.
  const uint64_t end = offset + bytes.size();
  if (end > buffer_offset_) {
    const uint64_t from = std::max(offset, buffer_offset_);
    std::memcpy(buffer_.data() + (from - buffer_offset_), bytes.data() + (from - offset),
                static_cast<size_t>(end - from));
  }
  if (offset < buffer_offset_) {
    pwrite_all(bytes.data(), std::min(end, buffer_offset_) - offset, offset);
  }
}

void AtomicFile::commit() {
  check_usable();
  flush();
  if (::fsync(fd_) != 0) {
    const int error = errno;
    fail(kNoOffset, errno_text("fsync", error));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int error = errno;
    fail(kNoOffset, errno_text("close", error));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    fail(kNoOffset, errno_text("rename to " + path_, error));
  }
  committed_ = true;
  // The rename is durable once the directory is synced.
  std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (parent.empty()) parent = ".";
  const std::string directory = parent.string();
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int error = errno;
    throw SerializationError(directory, kNoOffset, errno_text("open", error));
  }
  const int synced = ::fsync(dir_fd);
  const int error = errno;
  ::close(dir_fd);
  if (synced != 0) {
    throw SerializationError(directory, kNoOffset, errno_text("fsync", error));
  }
}

}  // namespace zinf::serialization
