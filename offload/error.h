// Error policy of the offload layer.
//
// Every failure a caller can act on is thrown as zinf::offload::OffloadError: an accelerator
// allocation over its budget, a pinned-buffer request that can never be satisfied, a swap
// directory without enough free space, a swap file in use by another process, an I/O error
// (the aio layer's IoError is caught at this layer's boundary and rethrown with the swap
// file, offset and errno text), and an extent whose checksum does not match what was
// written. The message carries the numbers a user needs (bytes requested, in use, budget;
// path, needed, free; file and offset); kind() lets a caller branch without parsing it.
// Nothing in this layer asserts a runtime condition or exits the process.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zinf::offload {

enum class ErrorKind {
  kConfig,   // a configuration that cannot work (names the config key)
  kBudget,   // accelerator allocation over its memory budget
  kPool,     // pinned-buffer request that can never be satisfied
  kSpace,    // not enough free space for the swap files
  kIo,       // read/write/open/fallocate failed (wraps aio::IoError)
  kCorrupt,  // checksum mismatch, or an extent whose last write did not complete
  kDevice,   // accelerator runtime failure (CUDA error, no device)
  kUsage,    // a call the object's state does not allow (unknown id, wrong stream type)
};

std::string_view to_string(ErrorKind kind) noexcept;

class OffloadError : public std::runtime_error {
 public:
  OffloadError(ErrorKind kind, const std::string& message);

  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws `error` (a host function's failure on `stream`, e.g. "cpu stream") as an
// OffloadError: unchanged when it is one, else kDevice naming the stream and its message.
[[noreturn]] void rethrow_host_function_error(std::exception_ptr error, std::string_view stream);

}  // namespace zinf::offload
