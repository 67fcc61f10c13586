// The records of one transfer shared by an AioHandle and its workers (internal to aio/).
//
// A Transfer is one pread/pwrite/async_* call: a file range cut into one Part per worker
// (aio/request_plan.h). The handle owns the Transfer; a worker works on a Part from the moment
// it is enqueued until it hands it back through PartListener::part_done(), after which the
// worker never touches the part again (the transfer may be freed at once once its last part
// is done).
//
// Thread safety: a Part's fields below "owned by the worker" are touched only by the worker
// holding it; a Transfer's fields below "guarded" only under the handle's mutex; the rest is
// fixed before the parts are enqueued. SharedStats are relaxed atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aio/backend.h"
#include "aio/error.h"
#include "aio/file_cache.h"

namespace zinf::aio::internal {

// O_DIRECT alignment of file offsets, lengths and memory, in bytes.
inline constexpr uint64_t kBlock = 4096;

constexpr uint64_t align_down(uint64_t value) { return value & ~(kBlock - 1); }

// Builds the IoError of a failed transfer without letting an allocation failure escape a
// worker thread (the bad_alloc itself is reported instead).
inline std::exception_ptr make_io_error(Op op, const std::string& path, uint64_t offset,
                                        uint64_t length, int error,
                                        std::string_view detail) noexcept {
  try {
    return std::make_exception_ptr(
        IoError(std::string(to_string(op)), path, offset, length, error, std::string(detail)));
  } catch (...) {
    return std::current_exception();
  }
}

struct Transfer;

// The contiguous share of one transfer handled by one worker.
struct Part {
  Transfer* transfer = nullptr;
  Part* next = nullptr;  // link in a worker's queue, then in its active list
  size_t worker = 0;
  uint64_t begin = 0;  // file range [begin, end)
  uint64_t end = 0;
  std::byte* memory = nullptr;  // user memory of byte `begin`
  bool congruent = false;       // memory address == file offset (mod 4096)
  // Owned by the worker while the part is active:
  uint64_t cursor = 0;       // next file offset to issue
  unsigned in_flight = 0;    // slots working on this part
  std::exception_ptr error;  // first failure; no further requests once set
};

struct Transfer {
  Op op = Op::kRead;
  bool async = false;
  uint64_t ticket = 0;  // async: what async_* returned, for wait_for()
  std::shared_ptr<const FileEntry> file;
  uint64_t offset = 0;  // the file range [offset, offset + bytes), for messages
  uint64_t bytes = 0;
  std::vector<Part> parts;  // fixed before the parts are enqueued
  // Guarded by AioHandle::Impl::mutex_:
  size_t parts_left = 0;
  bool done = false;
  std::exception_ptr error;
};

// Counters behind AioHandle::stats().
struct SharedStats {
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bounced_bytes{0};
  std::atomic<uint64_t> fixed_requests{0};
};

// How a worker reports to the handle.
class PartListener {
 public:
  // `part` ended (done or failed); the worker no longer touches it. Runs on the worker.
  virtual void part_done(Part& part) = 0;
  // A worker's engine failed; `reason` names the request in flight when it did.
  virtual void engine_failed(int error, const std::string& reason) noexcept = 0;

 protected:
  ~PartListener() = default;
};

}  // namespace zinf::aio::internal
