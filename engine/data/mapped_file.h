// MappedFile: a whole file mapped read-only into memory, for the token sources of
// engine/data. Internal to zinf_data.
//
// The mapping is made at open() and removed on destruction (RAII); the file descriptor is
// closed as soon as the mapping exists. Errors are DataError naming the path and the errno
// text of the call that failed; an empty file or one that is not a regular file is an error
// too (there is nothing to map).
//
// Thread safety: a MappedFile is immutable after opening; data() may be read from any thread.
#pragma once

#include <cstdint>
#include <string>

namespace zinf::data::detail {

class MappedFile {
 public:
  // Maps `path` whole. Throws DataError when it cannot be opened, is not a regular file, is
  // empty or cannot be mapped.
  [[nodiscard]] static MappedFile open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  [[nodiscard]] const uint8_t* data() const noexcept { return data_; }
  [[nodiscard]] uint64_t size_bytes() const noexcept { return size_bytes_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size_bytes) noexcept;
  void unmap() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

}  // namespace zinf::data::detail
