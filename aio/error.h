// Error policy of the aio layer.
//
// Every failure a caller can act on is thrown as zinf::aio::IoError, carrying the path, the
// byte offset and length of the transfer that failed, and the errno value with its text.
// Internals (backends, the fault seam) use liburing's convention instead: a negative errno
// as the return value, never the global errno. Handle-level calls turn those into IoError.
// Nothing in this layer asserts a runtime condition or exits the process.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zinf::aio {

class IoError : public std::runtime_error {
 public:
  // `op` is a short verb ("read", "write", "open", "fallocate", ...); `error` a positive
  // errno value (0 when the failure is not an errno, e.g. a transfer that made no progress).
  IoError(std::string op, std::string path, uint64_t offset, uint64_t length, int error,
          std::string detail = {});

  const std::string& op() const noexcept { return op_; }
  const std::string& path() const noexcept { return path_; }
  uint64_t offset() const noexcept { return offset_; }
  uint64_t length() const noexcept { return length_; }
  int error() const noexcept { return error_; }

 private:
  std::string op_;
  std::string path_;
  uint64_t offset_;
  uint64_t length_;
  int error_;
};

}  // namespace zinf::aio
