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
// each other (a user-space read-modify-write of a shared block could). Offsets are 64-bit:
// files beyond 4 GiB work. When the filesystem refuses O_DIRECT (tmpfs answered EINVAL
// before Linux 6.6) the file is opened buffered instead, one warning line is logged, and
// the path is listed by buffered_paths().
//
// Writes create missing files (mode 0644) and never truncate. Short transfers continue
// with the remainder, EINTR/EAGAIN are retried, and every other failure surfaces as an
// IoError naming path, offset, length and errno text (see aio/error.h).
//
// Registered memory (io_uring fixed buffers): register_buffers() hands long-lived ranges (a
// pinned pool's buffers) to every worker's ring once, so requests whose memory lies inside
// one of them skip the kernel's per-request page pinning (IORING_OP_READ_FIXED/WRITE_FIXED).
// Any other memory keeps working through the normal path; other backends ignore the call.
//
// If an engine itself fails (its ring or context, not one request), the worker cancels what
// the kernel still holds, reaps every one of those requests (retrying failed waits for as
// long as it takes), then tears the engine down and fails the transfers it held. The handle
// is then broken(): every later transfer, on any file, fails at once with an IoError naming
// its own range and, in its text, the file, offset and length of the request in flight when
// the engine broke (broken_reason()). Make a new handle.
//
// No hang: every wait for I/O (pread, pwrite, wait, wait_for) has a deadline of
// config.io_timeout_s seconds from the moment it starts waiting. A transfer that has not
// ended by then fails with an IoError (errno ETIMEDOUT) naming its file, offset and length,
// the time waited and the deadline, and the handle becomes broken(): its workers stop
// issuing and ask the kernel to cancel what it holds, and every later transfer fails at once.
// The transfers the timed-out wait was waiting for are no longer the caller's to collect
// (pending() drops them), but the kernel may still write their memory: the handle keeps its
// own memory for them (transfer records, staging memory) until its destructor, and the
// caller must keep their buffers valid until the handle is destroyed.
//
// Thread safety: all public methods may be called from any thread; async requests from
// several threads share the handle's workers, and wait() waits for all of them, while
// wait_for() waits only for the transfers whose tickets it is given. Buffers passed to
// async_* must stay valid and untouched until the wait() or wait_for() collecting that
// transfer returns. The destructor waits for in-flight requests (it never abandons memory
// the kernel is still writing; on a broken handle it first asks the kernel to cancel them, and
// still blocks until the kernel has returned each one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  uint64_t requests = 0;        // requests handed to backends
  uint64_t bounced_bytes = 0;   // bytes that went through bounce/staging memory
  uint64_t fixed_requests = 0;  // requests (of `requests`) that used a registered buffer
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

  // Synchronous transfer of `bytes` bytes; returns when all are done. Throws IoError, also
  // when they are not done within io_timeout_s (the handle is then broken, see above).
  // Requests queued with async_* before this call are not waited for.
  void pread(void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);
  void pwrite(const void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);

  // Queue a transfer and return at once; it starts as soon as a worker is free. Many may be
  // in flight across files. Returns the transfer's ticket (1, 2, ... per handle; callers that
  // only use wait() may ignore it). Errors are reported by the wait() or wait_for() that
  // collects the transfer.
  uint64_t async_pread(void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset);
  uint64_t async_pwrite(const void* buffer, uint64_t bytes, const std::string& path,
                        uint64_t file_offset);

  // Blocks until every queued async transfer has ended and collects them; returns how many
  // it collected. If any failed, all others are still waited for and then the first failure
  // is thrown. Transfers collected by wait_for() are neither counted nor reported again.
  // If they have not all ended within io_timeout_s, throws the timeout IoError of the oldest
  // one not ended; all of them leave pending() and the handle is broken (see above).
  int wait();

  // Blocks until the transfers with these tickets have ended, and collects them: afterwards
  // they are no longer pending() and wait() neither counts nor reports them. If any failed,
  // all are still waited for and then the failure of the lowest failed ticket is thrown,
  // here and only here. A ticket already collected (by wait() or an earlier wait_for(),
  // which reported its outcome) is skipped. Throws std::invalid_argument, before waiting for
  // anything, for a ticket this handle never issued.
  // Past io_timeout_s, throws the timeout IoError of the lowest ticket not ended; the waited
  // transfers leave pending(), other tickets stay pending, and the handle is broken.
  // Other transfers keep running and are not waited for, so one handle can serve several
  // independent batches (each waiting for its own tickets from its own thread).
  void wait_for(uint64_t ticket);
  void wait_for(std::span<const uint64_t> tickets);

  // Async transfers queued and not yet collected by wait() or wait_for().
  int pending() const;

  // Paths opened without O_DIRECT because the filesystem refused it.
  std::vector<std::string> buffered_paths() const;

  AioStats stats() const;

  // Registers memory ranges {data, bytes} with every worker's engine, in addition to those
  // already registered (an exact repeat is ignored). On io_uring, a request whose memory lies
  // entirely inside one registered range then uses a fixed buffer; requests partly inside or
  // outside, and bounce/staging memory, take the normal path. Blocks until every worker has
  // applied the new table (each first finishes the requests it has in flight).
  // Returns true when the engine uses the ranges; false (transfers still work) when the
  // backend has no fixed buffers or the kernel refused them (e.g. RLIMIT_MEMLOCK without
  // CAP_IPC_LOCK: one warning line). The memory must stay mapped, and must not be freed,
  // until unregister_buffers() for it has returned: a registered address reused by a new
  // allocation would still reach the old pages. Throws std::invalid_argument for a null or
  // empty range, or one overlapping a registered range it does not equal.
  bool register_buffers(std::span<const std::pair<void*, size_t>> ranges);
  // Drops ranges registered earlier (matched by start and length; unknown ones are ignored).
  // Blocks like register_buffers(); afterwards no new request uses them.
  void unregister_buffers(std::span<const std::pair<void*, size_t>> ranges);

  // Whether the handle is broken: its engine failed, or a wait timed out (see above). A
  // broken handle fails every later transfer at once with an IoError that names its own
  // range and repeats broken_reason(); upper layers replace it with a new handle.
  bool broken() const;
  // Why the handle broke (names the file, offset and length of the request it broke on);
  // empty while it is not broken.
  std::string broken_reason() const;

  // Closes cached file descriptors of `path` (e.g. before the file is deleted). Must not be
  // called while transfers on that path are in flight.
  void close_file(const std::string& path);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::aio
