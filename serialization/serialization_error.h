// Error policy of the serialization layer (zip, pickle, safetensors).
//
// Every failure — a malformed file, a truncated record, a lying size, a failed system call —
// is thrown as zinf::serialization::SerializationError, naming the file, the byte offset the
// problem was found at (kNoOffset when no single offset is meaningful) and what was wrong.
// Readers never crash, hang or allocate more than the input's size can justify on bad input;
// nothing in this layer asserts a runtime condition or exits the process.
//
// Thread safety: an error object is immutable once constructed.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace zinf::serialization {

// The offset of an error that no single byte position describes (open failed, bad option).
inline constexpr uint64_t kNoOffset = std::numeric_limits<uint64_t>::max();

class SerializationError : public std::runtime_error {
 public:
  // what() reads "<file>: offset <offset>: <what>", or "<file>: <what>" for kNoOffset.
  SerializationError(std::string file, uint64_t offset, const std::string& what)
      : std::runtime_error(format(file, offset, what)), file_(std::move(file)), offset_(offset) {}

  const std::string& file() const noexcept { return file_; }
  uint64_t offset() const noexcept { return offset_; }

 private:
  static std::string format(const std::string& file, uint64_t offset, const std::string& what) {
    std::string message = file;
    if (offset != kNoOffset) {
      message += ": offset ";
      message += std::to_string(offset);
    }
    message += ": ";
    message += what;
    return message;
  }

  std::string file_;
  uint64_t offset_;
};

}  // namespace zinf::serialization
