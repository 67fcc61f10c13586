// Worker: one long-lived I/O thread of an AioHandle and the engine (Backend) it drives
// (internal to aio/), in fio's steps: prep requests into free slots, submit them, reap
// completions, continue or finish each.
//
// Each worker owns a Backend and a fixed table of queue_depth slots (the slot index is the
// request's tag), so the hot path allocates nothing: a slot carries one request from prep
// through every continuation (short transfer, EINTR/EAGAIN retry) to its end. A worker keeps
// a FIFO of active parts from any number of transfers and fills free slots from the oldest
// part first; request shapes come from aio/request_plan.h, bounce/staging memory from
// aio/bounce.h. A request straight from user memory that lies inside a registered range
// carries that range's fixed-buffer index (io_uring READ_FIXED/WRITE_FIXED); continuations
// keep it. Registered-buffer tables are changed at a quiescent point: the worker stops
// issuing, lets its requests in flight finish, swaps the ring's table, then resumes.
//
// Failures: a failed request fails its part (an IoError naming path, offset, length, errno);
// a failed engine is cancelled and drained (every request the kernel holds is reaped before
// it is destroyed), then fails every part the worker holds or is given later; a halted worker
// (the handle's wait timed out) cancels what the kernel holds and fails its parts. No slot,
// user or staging memory is released while the kernel may still use it.
//
// Thread safety: the public methods may be called from any thread (one mutex); everything
// else runs on the worker thread. A part, once enqueued, belongs to the worker until
// PartListener::part_done().
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "aio/backend.h"
#include "aio/bounce.h"
#include "aio/buffer_table.h"
#include "aio/config.h"
#include "aio/transfer.h"

namespace zinf::aio::internal {

// One queue slot: a request from first prep to its end, continuations included.
struct Slot {
  Part* part = nullptr;
  Request request;
  std::byte* memory = nullptr;         // request.buffer, as bytes
  uint64_t origin_offset = 0;          // file offset the slot's memory starts at
  std::byte* origin_memory = nullptr;  // memory of origin_offset
  uint64_t need_end = 0;               // done once the file up to here is transferred
  uint64_t user_begin = 0;             // user bytes this slot covers: [user_begin, need_end)
  std::byte* user_memory = nullptr;    // user memory of user_begin
  bool staged = false;                 // memory is bounce/staging memory
  bool direct = false;                 // request.fd is O_DIRECT: stay block aligned
  int retries = 0;
  uint64_t sequence = 0;  // issue order of the worker's requests (the oldest is named)
};

class Worker {
 public:
  Worker(PartListener& listener, std::unique_ptr<Backend> backend, const AioConfig& config,
         SharedStats& stats)
      : listener_(listener),
        backend_(std::move(backend)),
        name_(backend_->name()),
        single_submit_(config.single_submit),
        overlap_events_(config.overlap_events),
        capacity_(std::max(
            1u, std::min(backend_->capacity(), static_cast<unsigned>(config.queue_depth)))),
        request_bytes_(std::min<uint64_t>(config.block_size, kMaxRequestBytes)),
        slot_bytes_(staging_slot_bytes(request_bytes_, capacity_)),
        fixed_buffers_(backend_->caps().fixed_buffers),
        stats_(stats),
        slots_(capacity_),
        completions_(capacity_),
        staging_(capacity_, slot_bytes_) {
    free_.reserve(capacity_);
    for (unsigned i = capacity_; i > 0; --i) free_.push_back(i - 1);
  }

  ~Worker() { stop_and_join(); }

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  // Appends `part` to the worker's FIFO (no allocation: parts are linked through Part::next).
  void enqueue(Part* part);

  // Hands the worker a new registered-buffer table; it applies it at its next quiescent point.
  void post_buffer_table(std::shared_ptr<const BufferTable> table);

  // Blocks until the table of `generation` (or a later one) is applied; returns whether the
  // engine uses fixed buffers now.
  bool wait_buffer_table(uint64_t generation);

  // Asks the worker to halt (see halt()) the next time it gets control; the handle is broken.
  void request_cancel();

  // Finishes every queued part and request in flight, then ends the thread.
  void stop_and_join();

 private:
  unsigned in_flight() const { return capacity_ - static_cast<unsigned>(free_.size()); }

  // Everything below runs on the worker thread. Nothing in it throws: failures become
  // IoErrors stored in the parts (make_io_error), and the loop allocates nothing.
  void run() noexcept;

  // Moves queued parts to the active list and takes a posted buffer table, blocking while
  // there is nothing to do. Returns false when the worker is stopping and has nothing left.
  bool take_new_parts();

  // Swaps the engine's fixed-buffer table; called with nothing in flight.
  void apply_buffer_table();

  void fill();

  void issue_next(Part& part);

  void stage(Slot& slot);

  void submit_staged();

  void reap();

  void on_complete(Slot& slot, int64_t result);

  void finish_request(Slot& slot);

  // Reports the user's bytes the request carries (a bounce read starts before them).
  void fail_request(Slot& slot, int error, std::string_view detail);

  void fail_request(Slot& slot, int error, std::string_view detail, uint64_t offset,
                    uint64_t length);

  void fail_part(Part& part, int error, std::string_view detail);

  void release(Slot& slot);

  // The engine itself failed (its ring or context, not one request): fail everything this
  // worker holds and every later part. Before the engine is torn down its requests are
  // cancelled and reaped, however long the kernel takes and however often a wait fails, so
  // no slot (nor the user or staging memory it points to) is released, and no ring closed,
  // while the kernel may still read or write that memory.
  void fail_engine(int error, std::string_view detail);

  // Cancels the requests the kernel holds and reaps until it has returned every one. Their
  // results are dropped: the caller fails their slots. Waits that fail are retried (the
  // alternative, closing the engine, would let the kernel write into freed memory).
  void drain() noexcept;

  // A wait on the handle timed out (the handle is broken): stop issuing, fail every part,
  // and ask the kernel to cancel what it holds. Requests in flight still end (cancelled or
  // not) before their slots are released.
  void halt();

  void retire_done_parts();

  PartListener& listener_;
  std::unique_ptr<Backend> backend_;  // null once the engine failed
  const std::string name_;            // the backend's name, for messages
  const bool single_submit_;
  const bool overlap_events_;
  const unsigned capacity_;
  const uint64_t request_bytes_;  // block_size, capped at kMaxRequestBytes
  const uint64_t slot_bytes_;     // staging memory per slot (multiple of 4096)
  const bool fixed_buffers_;      // the backend supports register_buffers()
  SharedStats& stats_;

  std::mutex mutex_;
  std::condition_variable cv_;          // work queued, table posted or stopping
  std::condition_variable applied_cv_;  // a posted table was applied
  Part* queue_head_ = nullptr;          // guarded by mutex_: FIFO linked through Part::next
  Part* queue_tail_ = nullptr;          // guarded by mutex_
  std::shared_ptr<const BufferTable> posted_table_;  // guarded by mutex_: not yet taken
  uint64_t applied_generation_ = 0;                  // guarded by mutex_
  bool applied_fixed_ = false;                       // guarded by mutex_
  bool stopping_ = false;                            // guarded by mutex_
  std::atomic<bool> wake_{false};                    // queue_head_ or posted_table_ may be set
  std::atomic<bool> cancel_requested_{false};        // request_cancel() was called
  std::thread thread_;

  // Worker thread only:
  Part* active_head_ = nullptr;  // parts being issued, oldest first
  Part* active_tail_ = nullptr;
  std::shared_ptr<const BufferTable> next_table_;  // taken, applied once nothing is in flight
  std::shared_ptr<const BufferTable> table_;       // the engine's table; null: none
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;
  std::vector<Completion> completions_;
  StagingMemory staging_;
  unsigned staged_ = 0;     // prepped, not yet taken by submit()
  unsigned in_kernel_ = 0;  // submitted, not yet reaped
  uint64_t next_sequence_ = 0;
  int broken_error_ = 0;       // the engine failed (backend_ is null)
  std::string broken_detail_;  // why, naming the oldest request then in flight
  bool halted_ = false;        // halt() ran
};

}  // namespace zinf::aio::internal
