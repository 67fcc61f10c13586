// Backend: one asynchronous I/O engine instance (io_uring ring, libaio context or a psync
// loop), in the style of fio's ioengines: capability flags, and separate steps to stage a
// request (prep), hand everything staged to the kernel (submit) and collect completions
// (reap), so batching is visible in the interface and nothing allocates on the hot path.
//
// Error convention (liburing's): every call returns a non-negative value on success and a
// negative errno on failure; the global errno is never part of the contract. A completion
// carries the request's tag and its result: the bytes transferred (possibly fewer than asked:
// the caller continues the remainder) or a negative errno (-EINTR/-EAGAIN: retry).
//
// Every request accepted by prep() produces exactly one completion, once submitted. A
// backend owns no file descriptors and no buffers; the caller keeps both valid until the
// request's completion has been reaped.
//
// Thread safety: none. A backend belongs to one thread at a time (AioHandle gives each
// worker thread its own); hand it over only with a happens-before edge (thread start).
#pragma once

#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "aio/config.h"

namespace zinf::aio {

enum class Op : uint8_t { kRead, kWrite };

std::string_view to_string(Op op);  // "read" / "write"

struct Request {
  Op op = Op::kRead;
  int fd = -1;              // used unless file_index >= 0
  int file_index = -1;      // slot in register_files(), or -1
  int buffer_index = -1;    // slot in register_buffers() containing `buffer`, or -1
  void* buffer = nullptr;   // source (write) or destination (read)
  uint32_t bytes = 0;       // transfer length; at most kMaxRequestBytes
  uint64_t offset = 0;      // file offset in bytes
  uint64_t tag = 0;         // returned unchanged in the completion
  std::string_view path{};  // for diagnostics and fault matching only; never opened
};

struct Completion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred (>= 0) or -errno
};

// Largest single request (Linux transfers at most 0x7ffff000 bytes per read/write call).
inline constexpr uint32_t kMaxRequestBytes = 1u << 30;

struct BackendCaps {
  bool kernel_async = false;      // requests progress in the kernel after submit()
  bool registered_files = false;  // register_files() and Request::file_index work
  bool fixed_buffers = false;     // register_buffers() and Request::buffer_index work
};

class Backend {
 public:
  Backend() = default;
  virtual ~Backend() = default;

  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view name() const noexcept = 0;
  virtual BackendCaps caps() const noexcept = 0;
  // Most requests that may be staged plus in flight at once.
  virtual unsigned capacity() const noexcept = 0;

  // Stages one request without entering the kernel. Returns 0, or -EBUSY when capacity()
  // requests are already staged or in flight, or -EINVAL for a malformed request.
  virtual int prep(const Request& request) = 0;

  // Hands every staged request to the kernel (psync: performs them). Returns how many left
  // the staged state (>= 0). On -EAGAIN/-EBUSY/-EINTR nothing more was taken: reap, then call
  // again. Any other negative errno means the engine itself failed.
  virtual int submit() = 0;

  // Moves up to out.size() completions into `out`, first blocking until at least
  // `min_complete` are available. The caller must not ask for more than it has submitted and
  // not yet reaped. Returns the number written, or -errno (-EINTR: call again).
  virtual int reap(std::span<Completion> out, unsigned min_complete) = 0;

  // Asks the kernel to cancel every submitted request not yet reaped. Each still produces
  // its completion through reap() (-ECANCELED, or its real result when it ended first), so
  // the caller keeps reaping until it has them all. Returns 0, or -errno when nothing could
  // be cancelled (the completions still arrive). Engines whose requests end inside submit()
  // (psync) have nothing to cancel.
  virtual int cancel() { return 0; }

  // Optional (see caps()). Replace the registered table; an empty span unregisters.
  virtual int register_files(std::span<const int> fds) {
    (void)fds;
    return -EOPNOTSUPP;
  }
  virtual int register_buffers(std::span<const iovec> buffers) {
    (void)buffers;
    return -EOPNOTSUPP;
  }
};

// Engine constructors. `queue_depth` is capacity(). Throw IoError naming the failing setup
// call (e.g. io_uring disabled by the kernel or a seccomp policy, libaio's aio-max-nr
// exhausted) and the backend to choose instead.
std::unique_ptr<Backend> make_io_uring_backend(unsigned queue_depth);
std::unique_ptr<Backend> make_libaio_backend(unsigned queue_depth);
std::unique_ptr<Backend> make_psync_backend(unsigned queue_depth);

// The engine `config.backend` with capacity `config.queue_depth`.
std::unique_ptr<Backend> make_backend(const AioConfig& config);

}  // namespace zinf::aio
