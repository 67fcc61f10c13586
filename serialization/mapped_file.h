// A read-only memory mapping of a whole file, shared by the serialization readers (zip,
// pickle, safetensors). Readers hand out std::span views into the mapping, so the mapping
// must outlive every view taken from it.
//
// The mapping shows the file as it is: a file truncated by another process while mapped
// raises SIGBUS on access to the lost pages. zinf's writers replace files by rename, never in
// place, so a file zinf is reading is not truncated by zinf.
//
// An empty file is valid: data() is nullptr and size() is 0 (mmap of length 0 is refused by
// the kernel, so no mapping is made).
//
// Thread safety: a MappedFile is immutable after open(); its const accessors may be called
// from any number of threads. Moving from it or destroying it must not race with readers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace zinf::serialization {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). Throws SerializationError (offset kNoOffset) naming
  // the path and the errno text when open, fstat or mmap fails, or when `path` is not a
  // regular file.
  static MappedFile open(const std::string& path);

  MappedFile() = default;  // an empty mapping with an empty path
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The first byte of the file; nullptr when the file is empty.
  const uint8_t* data() const noexcept { return data_; }
  // The file's size in bytes when it was opened.
  uint64_t size() const noexcept { return size_; }
  // The whole file as a span.
  std::span<const uint8_t> bytes() const noexcept { return {data_, static_cast<size_t>(size_)}; }
  // The path given to open().
  const std::string& path() const noexcept { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void reset() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace zinf::serialization
