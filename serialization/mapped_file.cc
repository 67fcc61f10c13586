#include "serialization/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "serialization/serialization_error.h"

namespace zinf::serialization {
namespace {

// Closes an fd on scope exit; the mapping stays valid after close.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

std::string errno_text(const char* op, int error) {
  return std::string(op) + " failed: " + std::strerror(error);
}

}  // namespace

MappedFile MappedFile::open(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw SerializationError(path, kNoOffset, errno_text("open", errno));
  }
  FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw SerializationError(path, kNoOffset, errno_text("fstat", errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw SerializationError(path, kNoOffset, "not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    return MappedFile(path, nullptr, 0);
  }
  void* address = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) {
    throw SerializationError(path, kNoOffset, errno_text("mmap", errno));
  }
  return MappedFile(path, static_cast<const uint8_t*>(address), size);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) {
    // munmap of a range we mapped cannot fail for a valid argument; nothing to report to.
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace zinf::serialization
