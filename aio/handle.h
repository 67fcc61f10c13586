// AioHandle: the one entry point through which zinf moves bytes between memory and files.
//
// A handle owns `intra_op_parallelism` long-lived worker threads, each with its own backend
// instance (io_uring ring, libaio context or psync loop) holding up to `queue_depth`
// requests in flight. A read or write of n bytes is cut into one contiguous part per worker
// (part boundaries on 4096-byte multiples, so any n works, including n not divisible by the
// thread count), and each part into `block_size` requests.
//
// Any length at any offset: the 4096-aligned bulk goes straight to the file with O_DIRECT
// when the user buffer allows it (or through aligned staging memory when it does not).
// Unaligned head and tail bytes of a read are fetched as an aligned block into bounce memory;
// those of a write are written as exactly those bytes through a second, buffered descriptor
// of the file, so the kernel's page cache does the read-modify-write: the file never grows
// past the last byte written and neighbouring unaligned writes in flight at once cannot undo
// each other (a user-space read-modify-write of a shared block could). Offsets are 64-bit: files
// beyond 4 GiB work. When the filesystem refuses O_DIRECT (tmpfs answers EINVAL) the file is opened
// buffered instead, one warning line is logged, and the path is listed by buffered_paths().
//
// Writes create missing files (mode 0644) and never truncate. Short transfers continue
// with the remainder, EINTR/EAGAIN are retried, and every other failure surfaces as an
// IoError naming path, offset, length and errno text (see aio/error.h).
//
// Thread safety: all public methods may be called from any thread; async requests from
// several threads share the handle's workers, and wait() waits for all of them. Buffers
// passed to async_* must stay valid and untouched until wait() returns. The destructor
// waits for in-flight requests (it never abandons memory the kernel is still writing).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aio/config.h"

namespace zinf::aio {

class Backend;

// Builds the backend for one worker thread. The default builds `config.backend`; tests
// pass a factory that wraps it in a fault-injecting backend (aio/fault_backend.h).
using BackendFactory = std::function<std::unique_ptr<Backend>(const AioConfig& config)>;

struct AioStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t requests = 0;       // requests handed to backends
  uint64_t bounced_bytes = 0;  // bytes that went through bounce/staging memory
};

class AioHandle {
 public:
  // Throws std::invalid_argument for a bad config, IoError when the backend cannot be set
  // up (e.g. io_uring not permitted: the message says which backend to choose instead).
  explicit AioHandle(AioConfig config);
  AioHandle(AioConfig config, BackendFactory factory);
  ~AioHandle();

  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  const AioConfig& config() const noexcept;
  std::string_view backend_name() const noexcept;

  // Synchronous transfer of `bytes` bytes; returns when all are done. Throws IoError.
  // Requests queued with async_* before this call are not waited for.
  void pread(void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);
  void pwrite(const void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);

  // Queue a transfer and return at once; it starts as soon as a worker is free. Many may be
  // in flight across files. Errors are reported by wait().
  void async_pread(void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);
  void async_pwrite(const void* buffer, uint64_t bytes, const std::string& path,
                    uint64_t file_offset);

  // Blocks until every queued async transfer has ended; returns how many ended. If any
  // failed, all others are still waited for and then the first failure is thrown.
  int wait();

  // Async transfers queued and not yet collected by wait().
  int pending() const;

  // Paths opened without O_DIRECT because the filesystem refused it.
  std::vector<std::string> buffered_paths() const;

  AioStats stats() const;

  // Closes cached file descriptors of `path` (e.g. before the file is deleted). Must not be
  // called while transfers on that path are in flight.
  void close_file(const std::string& path);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::aio
