#include "engine/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/data/data.h"

namespace zinf::data::detail {
namespace {

// Closes a descriptor on every path out of open().
class FdCloser {
 public:
  explicit FdCloser(int fd) noexcept : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw DataError(path + ": " + what + ": " + std::strerror(error));
}

}  // namespace

MappedFile MappedFile::open(const std::string& path) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    fail(path, "cannot open for reading", errno);
  }
  const FdCloser closer(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    fail(path, "cannot stat", errno);
  }
  if (!S_ISREG(info.st_mode)) {
    throw DataError(path + ": not a regular file");
  }
  if (info.st_size == 0) {
    throw DataError(path + ": the file is empty (0 bytes): no tokens to read");
  }
  const auto size_bytes = static_cast<uint64_t>(info.st_size);
  void* mapping = ::mmap(nullptr, size_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) {
    fail(path, "cannot map " + std::to_string(size_bytes) + " bytes", errno);
  }
  return MappedFile(path, static_cast<const uint8_t*>(mapping), size_bytes);
}

MappedFile::MappedFile(std::string path, const uint8_t* data, uint64_t size_bytes) noexcept
    : path_(std::move(path)), data_(data), size_bytes_(size_bytes) {}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_ != nullptr) {
    // munmap fails only for an invalid range, which a mapping made by open() is not.
    ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
    data_ = nullptr;
    size_bytes_ = 0;
  }
}

}  // namespace zinf::data::detail
