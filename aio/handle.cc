// AioHandle: worker threads, request generation, completion handling (see aio/handle.h).
//
// Each worker owns a Backend and a fixed table of queue_depth slots (the slot index is the
// request's tag), so the hot path allocates nothing: a slot carries one request from prep
// through every continuation (short transfer, EINTR/EAGAIN retry) to its end. A transfer
// is cut into one Part per worker; a worker keeps a FIFO of active parts from any number of
// transfers and fills free slots from the oldest part first.
//
// How a part's bytes become requests (file offsets; B = 4096):
//   - buffered file (O_DIRECT refused): block_size requests straight from user memory;
//   - head/tail that does not cover a whole aligned block: reads fetch the aligned block
//     into the slot's bounce memory and copy the wanted bytes out; writes go through the
//     file's buffered descriptor with exactly the user's bytes (the page cache merges them,
//     so the file size stays exact and neighbouring unaligned writes cannot undo each other
//     as a read-modify-write of a shared block could);
//   - whole blocks: straight from user memory when it is congruent to the file offset
//     modulo B, otherwise through the slot's staging memory.
// A request straight from user memory that lies inside a registered range carries that
// range's fixed-buffer index (io_uring READ_FIXED/WRITE_FIXED); continuations keep it.
//
// Coherence of the two descriptors of a direct file: the kernel writes back dirty page-cache
// pages of the range before an O_DIRECT read or write and invalidates them after an O_DIRECT
// write, so a read right after an unaligned (buffered) write sees it, on every backend
// (tests: handle_test.cc, MixedDirectAndPartialBlockWritesStayCoherent). Concurrent
// transfers never put a direct and a buffered write on one block unless their ranges overlap.
//
// Registered-buffer tables are changed at a quiescent point of each worker: it stops issuing,
// lets its requests in flight finish, swaps the ring's table, then resumes.
#include "aio/handle.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "aio/backend.h"
#include "aio/error.h"
#include "aio/file_cache.h"

namespace zinf::aio {
namespace {

constexpr uint64_t kBlock = 4096;
// Consecutive EINTR/EAGAIN results, or continuations that made no progress, tolerated for
// one request before it fails.
constexpr int kMaxRetries = 32;
// Upper bound of one worker's staging memory (queue_depth slots); allocated on first use.
constexpr uint64_t kStagingLimitBytes = 64ull << 20;

// io_uring refuses fixed buffers larger than 1 GiB: longer ranges are registered in pieces.
constexpr uint64_t kMaxFixedBufferBytes = 1ull << 30;

// Failed waits while draining a failed engine retried at once before each waits 10 ms.
constexpr uint64_t kDrainFailuresBeforeBackoff = 64;

constexpr std::string_view kHaltedDetail =
    "cancelled: a wait on this handle timed out (the handle is broken)";

constexpr uint64_t align_down(uint64_t value) { return value & ~(kBlock - 1); }

// Builds the IoError of a failed transfer without letting an allocation failure escape a
// worker thread (the bad_alloc itself is reported instead).
std::exception_ptr make_io_error(Op op, const std::string& path, uint64_t offset, uint64_t length,
                                 int error, std::string_view detail) noexcept {
  try {
    return std::make_exception_ptr(
        IoError(std::string(to_string(op)), path, offset, length, error, std::string(detail)));
  } catch (...) {
    return std::current_exception();
  }
}

// The registered ranges as one engine table: `iovecs` in registration order (the index is
// the fixed-buffer index), `by_address` sorted and disjoint for lookups. Immutable once built.
struct BufferTable {
  struct Range {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int index = 0;
  };
  uint64_t generation = 0;
  std::vector<iovec> iovecs;
  std::vector<Range> by_address;

  // Index of the range holding all of [memory, memory + bytes), or -1.
  int find(const void* memory, uint64_t bytes) const noexcept {
    const auto begin = reinterpret_cast<uintptr_t>(memory);
    auto it = std::upper_bound(by_address.begin(), by_address.end(), begin,
                               [](uintptr_t value, const Range& r) { return value < r.begin; });
    if (it == by_address.begin()) return -1;
    --it;
    return begin < it->end && bytes <= it->end - begin ? it->index : -1;
  }
};

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

struct SharedStats {
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bounced_bytes{0};
  std::atomic<uint64_t> fixed_requests{0};
};

class PartListener {
 public:
  virtual void part_done(Part& part) = 0;
  // A worker's engine failed; `reason` names the request in flight when it did.
  virtual void engine_failed(int error, const std::string& reason) noexcept = 0;

 protected:
  ~PartListener() = default;
};

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

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
        slot_bytes_(
            std::max(kBlock, std::min(request_bytes_, align_down(kStagingLimitBytes / capacity_)))),
        fixed_buffers_(backend_->caps().fixed_buffers),
        stats_(stats),
        slots_(capacity_),
        completions_(capacity_) {
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
  void enqueue(Part* part) {
    part->next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_tail_ != nullptr) {
        queue_tail_->next = part;
      } else {
        queue_head_ = part;
      }
      queue_tail_ = part;
      wake_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
  }

  // Hands the worker a new registered-buffer table; it applies it at its next quiescent point.
  void post_buffer_table(std::shared_ptr<const BufferTable> table) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      posted_table_ = std::move(table);
      wake_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
  }

  // Blocks until the table of `generation` (or a later one) is applied; returns whether the
  // engine uses fixed buffers now.
  bool wait_buffer_table(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mutex_);
    applied_cv_.wait(lock, [&] { return applied_generation_ >= generation; });
    return applied_fixed_;
  }

  // Asks the worker to halt (see halt()) the next time it gets control; the handle is broken.
  void request_cancel() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancel_requested_.store(true, std::memory_order_release);
      wake_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
  }

  // Finishes every queued part and request in flight, then ends the thread.
  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  unsigned in_flight() const { return capacity_ - static_cast<unsigned>(free_.size()); }

  // Everything below runs on the worker thread. Nothing in it throws: failures become
  // IoErrors stored in the parts (make_io_error), and the loop allocates nothing.
  void run() noexcept {
    for (;;) {
      if (!take_new_parts()) return;
      if (!halted_ && cancel_requested_.load(std::memory_order_acquire)) halt();
      if (next_table_ && in_flight() == 0) apply_buffer_table();
      if (!next_table_ && (overlap_events_ || in_flight() == 0)) fill();
      submit_staged();
      if (in_kernel_ > 0) reap();
      retire_done_parts();
    }
  }

  // Moves queued parts to the active list and takes a posted buffer table, blocking while
  // there is nothing to do. Returns false when the worker is stopping and has nothing left.
  bool take_new_parts() {
    const bool idle = active_head_ == nullptr && in_flight() == 0 && !next_table_;
    if (!idle && !wake_.load(std::memory_order_acquire)) return true;
    std::unique_lock<std::mutex> lock(mutex_);
    if (idle) {
      cv_.wait(lock, [this] { return stopping_ || queue_head_ != nullptr || posted_table_; });
    }
    if (posted_table_) next_table_ = std::move(posted_table_);
    if (queue_head_ != nullptr) {
      for (Part* part = queue_head_; part != nullptr; part = part->next) {
        part->cursor = part->begin;
      }
      (active_tail_ != nullptr ? active_tail_->next : active_head_) = queue_head_;
      active_tail_ = queue_tail_;
      queue_head_ = queue_tail_ = nullptr;
    }
    wake_.store(false, std::memory_order_release);
    return !(stopping_ && active_head_ == nullptr && in_flight() == 0 && !next_table_);
  }

  // Swaps the engine's fixed-buffer table; called with nothing in flight.
  void apply_buffer_table() {
    std::shared_ptr<const BufferTable> table = std::move(next_table_);
    const uint64_t generation = table->generation;
    bool fixed = false;
    if (backend_ && fixed_buffers_) {
      int rc = backend_->register_buffers(table->iovecs);
      if (rc == 0) {
        fixed = !table->iovecs.empty();
      } else {
        spdlog::warn(
            "aio: {} refused {} registered buffer range(s) ({}); those transfers take the "
            "unregistered path (raise RLIMIT_MEMLOCK, e.g. `ulimit -l unlimited`)",
            name_, table->iovecs.size(), std::strerror(-rc));
        rc = backend_->register_buffers({});
        (void)rc;  // nothing registered either way
      }
    }
    table_ = fixed ? std::move(table) : nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      applied_generation_ = std::max(applied_generation_, generation);
      applied_fixed_ = fixed;
    }
    applied_cv_.notify_all();
  }

  void fill() {
    for (Part* part = active_head_; part != nullptr; part = part->next) {
      if (broken_error_ != 0 && !part->error) fail_part(*part, broken_error_, broken_detail_);
      if (halted_ && !part->error) fail_part(*part, ECANCELED, kHaltedDetail);
      while (!free_.empty() && !part->error && part->cursor < part->end) issue_next(*part);
      if (free_.empty()) break;
    }
  }

  void issue_next(Part& part) {
    const Transfer& transfer = *part.transfer;
    const FileEntry& file = *transfer.file;
    const unsigned index = free_.back();
    Slot& slot = slots_[index];
    const uint64_t at = part.cursor;
    const uint64_t remaining = part.end - at;
    std::byte* user = part.memory + (at - part.begin);

    int fd = file.fd.get();
    bool direct = file.direct;
    bool staged = false;
    uint64_t offset = at;
    uint64_t length = 0;   // bytes of the request
    uint64_t covered = 0;  // user bytes it carries
    std::byte* memory = user;
    if (!file.direct) {
      length = covered = std::min(remaining, request_bytes_);
    } else if (at % kBlock != 0 || remaining < kBlock) {
      covered = std::min(part.end, align_down(at) + kBlock) - at;
      if (transfer.op == Op::kWrite) {
        fd = file.buffered_fd.get();
        direct = false;
        length = covered;
      } else {
        offset = align_down(at);
        length = kBlock;
        staged = true;
      }
    } else {
      length = covered = std::min(align_down(remaining), request_bytes_);
      if (!part.congruent) {
        length = covered = std::min(length, slot_bytes_);
        staged = true;
      }
    }
    if (staged) {
      if (!ensure_staging()) {
        fail_part(part, ENOMEM, "allocating staging memory");
        return;
      }
      memory = staging_.get() + static_cast<size_t>(index) * slot_bytes_;
      if (transfer.op == Op::kWrite) std::memcpy(memory, user, covered);
    }

    free_.pop_back();
    ++part.in_flight;
    slot.sequence = next_sequence_++;
    part.cursor = at + covered;
    slot.part = &part;
    const int buffer_index = table_ && !staged ? table_->find(memory, length) : -1;
    slot.request = Request{.op = transfer.op,
                           .fd = fd,
                           .buffer_index = buffer_index,
                           .buffer = memory,
                           .bytes = static_cast<uint32_t>(length),
                           .offset = offset,
                           .tag = index,
                           .path = file.path};
    slot.memory = memory;
    slot.origin_offset = offset;
    slot.origin_memory = memory;
    slot.need_end = at + covered;
    slot.user_begin = at;
    slot.user_memory = user;
    slot.staged = staged;
    slot.direct = direct;
    slot.retries = 0;
    stage(slot);
  }

  bool ensure_staging() {
    if (staging_) return true;
    staging_.reset(static_cast<std::byte*>(
        std::aligned_alloc(kBlock, static_cast<size_t>(slot_bytes_) * capacity_)));
    return staging_ != nullptr;
  }

  void stage(Slot& slot) {
    if (!backend_) {
      fail_request(slot, broken_error_, broken_detail_);
      return;
    }
    if (halted_) {
      fail_request(slot, ECANCELED, kHaltedDetail);
      return;
    }
    const int rc = backend_->prep(slot.request);
    if (rc < 0) {
      fail_request(slot, -rc, "the engine refused the request");
      return;
    }
    ++staged_;
    stats_.requests.fetch_add(1, std::memory_order_relaxed);
    if (slot.request.buffer_index >= 0) {
      stats_.fixed_requests.fetch_add(1, std::memory_order_relaxed);
    }
    if (single_submit_) submit_staged();
  }

  void submit_staged() {
    int attempts = 0;
    while (staged_ > 0) {
      const int rc = backend_->submit();
      if (rc > 0) {
        staged_ -= static_cast<unsigned>(rc);
        in_kernel_ += static_cast<unsigned>(rc);
        continue;
      }
      if (rc == 0 || rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) {
        if (in_kernel_ > 0) return;  // reaping makes room; submit again after it
        if (++attempts <= kMaxRetries) {
          std::this_thread::yield();
          continue;
        }
      }
      fail_engine(rc == 0 ? EAGAIN : -rc, "in submit");
      return;
    }
  }

  void reap() {
    const unsigned min_complete = overlap_events_ ? 1 : in_kernel_;
    const int rc = backend_->reap(completions_, min_complete);
    if (rc == -EINTR || rc == -EAGAIN) return;  // the loop comes back here
    if (rc < 0) {
      fail_engine(-rc, "in reap");
      return;
    }
    in_kernel_ -= static_cast<unsigned>(rc);
    for (int i = 0; i < rc; ++i) {
      const Completion& completion = completions_[static_cast<size_t>(i)];
      // Unknown tags never come from a correct engine; released slots only after an engine
      // failure handled while this batch was being processed.
      if (completion.tag >= capacity_ || slots_[completion.tag].part == nullptr) continue;
      on_complete(slots_[completion.tag], completion.result);
    }
  }

  void on_complete(Slot& slot, int64_t result) {
    Request& request = slot.request;
    if (result < 0) {
      const int error = static_cast<int>(-result);
      const bool transient = error == EINTR || error == EAGAIN;
      if (transient && ++slot.retries <= kMaxRetries) {
        stage(slot);
      } else {
        fail_request(slot, error, transient ? "still failing after retries" : "");
      }
      return;
    }
    const uint64_t moved = std::min<uint64_t>(static_cast<uint64_t>(result), request.bytes);
    const uint64_t reached = request.offset + moved;
    if (reached >= slot.need_end) {
      finish_request(slot);
      return;
    }
    // Short transfer: continue with the remainder. An O_DIRECT read that stops short of a
    // block boundary (or any read returning 0) has hit the end of the file.
    if (request.op == Op::kRead && (moved == 0 || (slot.direct && moved % kBlock != 0))) {
      fail_request(
          slot, 0, "unexpected end of file (the file ends before the requested range does)",
          std::max(reached, slot.user_begin), slot.need_end - std::max(reached, slot.user_begin));
      return;
    }
    // O_DIRECT continuations restart at the last block boundary (re-sending a few bytes).
    const uint64_t next = slot.direct ? align_down(reached) : reached;
    if (next <= request.offset) {
      if (++slot.retries > kMaxRetries) {
        fail_request(slot, 0, "the transfer makes no progress");
      } else {
        stage(slot);
      }
      return;
    }
    const uint64_t advance = next - request.offset;
    request.offset = next;
    request.bytes -= static_cast<uint32_t>(advance);
    slot.memory += advance;
    request.buffer = slot.memory;
    slot.retries = 0;
    stage(slot);
  }

  void finish_request(Slot& slot) {
    const uint64_t bytes = slot.need_end - slot.user_begin;
    if (slot.request.op == Op::kRead) {
      if (slot.staged) {
        std::memcpy(slot.user_memory, slot.origin_memory + (slot.user_begin - slot.origin_offset),
                    bytes);
      }
      stats_.bytes_read.fetch_add(bytes, std::memory_order_relaxed);
    } else {
      stats_.bytes_written.fetch_add(bytes, std::memory_order_relaxed);
    }
    if (slot.staged) stats_.bounced_bytes.fetch_add(bytes, std::memory_order_relaxed);
    release(slot);
  }

  // Reports the user's bytes the request carries (a bounce read starts before them).
  void fail_request(Slot& slot, int error, std::string_view detail) {
    const uint64_t offset = std::max(slot.request.offset, slot.user_begin);
    fail_request(slot, error, detail, offset, slot.need_end - std::min(offset, slot.need_end));
  }

  void fail_request(Slot& slot, int error, std::string_view detail, uint64_t offset,
                    uint64_t length) {
    Part& part = *slot.part;
    if (!part.error) {
      part.error =
          make_io_error(slot.request.op, part.transfer->file->path, offset, length, error, detail);
    }
    release(slot);
  }

  void fail_part(Part& part, int error, std::string_view detail) {
    if (!part.error) {
      part.error = make_io_error(part.transfer->op, part.transfer->file->path, part.cursor,
                                 part.end - part.cursor, error, detail);
    }
  }

  void release(Slot& slot) {
    --slot.part->in_flight;
    slot.part = nullptr;
    free_.push_back(static_cast<unsigned>(&slot - slots_.data()));
  }

  // The engine itself failed (its ring or context, not one request): fail everything this
  // worker holds and every later part. Before the engine is torn down its requests are
  // cancelled and reaped, however long the kernel takes and however often a wait fails, so
  // no slot (nor the user or staging memory it points to) is released, and no ring closed,
  // while the kernel may still read or write that memory.
  void fail_engine(int error, std::string_view detail) {
    broken_error_ = error != 0 ? error : EIO;
    const Slot* oldest = nullptr;
    for (const Slot& slot : slots_) {
      if (slot.part != nullptr && (oldest == nullptr || slot.sequence < oldest->sequence)) {
        oldest = &slot;
      }
    }
    try {
      broken_detail_ =
          fmt::format("{} engine failed {} ({})", name_, detail, std::strerror(broken_error_));
      if (oldest != nullptr) {
        broken_detail_ += fmt::format(" with '{}' at offset {} (length {}) in flight",
                                      oldest->part->transfer->file->path, oldest->request.offset,
                                      oldest->request.bytes);
      }
      spdlog::error("aio: {}; failing its transfers", broken_detail_);
    } catch (...) {
      broken_detail_.clear();  // out of memory: the errno alone is reported
    }
    listener_.engine_failed(broken_error_, broken_detail_);
    drain();
    backend_.reset();
    table_.reset();
    for (Slot& slot : slots_) {
      if (slot.part != nullptr) fail_request(slot, broken_error_, broken_detail_);
    }
    staged_ = 0;
    in_kernel_ = 0;
    for (Part* part = active_head_; part != nullptr; part = part->next) {
      fail_part(*part, broken_error_, broken_detail_);
    }
  }

  // Cancels the requests the kernel holds and reaps until it has returned every one. Their
  // results are dropped: the caller fails their slots. Waits that fail are retried (the
  // alternative, closing the engine, would let the kernel write into freed memory).
  void drain() noexcept {
    if (in_kernel_ == 0) return;
    (void)backend_->cancel();  // completions arrive either way
    uint64_t failures = 0;
    while (in_kernel_ > 0) {
      const int rc = backend_->reap(completions_, 1);
      if (rc > 0) {
        in_kernel_ -= std::min(in_kernel_, static_cast<unsigned>(rc));
        continue;
      }
      if (rc == 0 || rc == -EINTR || rc == -EAGAIN) continue;
      ++failures;
      if (failures == kDrainFailuresBeforeBackoff) {
        spdlog::warn(
            "aio: {}: waiting for {} request(s) of a failed engine keeps failing ({}); still "
            "waiting: the kernel may write their memory until they end",
            name_, in_kernel_, std::strerror(-rc));
      }
      if (failures >= kDrainFailuresBeforeBackoff) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } else {
        std::this_thread::yield();
      }
    }
  }

  // A wait on the handle timed out (the handle is broken): stop issuing, fail every part,
  // and ask the kernel to cancel what it holds. Requests in flight still end (cancelled or
  // not) before their slots are released.
  void halt() {
    halted_ = true;
    if (backend_ && in_kernel_ > 0) (void)backend_->cancel();
    for (Part* part = active_head_; part != nullptr; part = part->next) {
      fail_part(*part, ECANCELED, kHaltedDetail);
    }
  }

  void retire_done_parts() {
    Part* previous = nullptr;
    Part* part = active_head_;
    while (part != nullptr) {
      Part* next = part->next;
      if (part->in_flight == 0 && (part->error || part->cursor >= part->end)) {
        (previous != nullptr ? previous->next : active_head_) = next;
        if (active_tail_ == part) active_tail_ = previous;
        listener_.part_done(*part);  // the part may be destroyed from here on
      } else {
        previous = part;
      }
      part = next;
    }
  }

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
  std::unique_ptr<std::byte, FreeDeleter> staging_;
  unsigned staged_ = 0;     // prepped, not yet taken by submit()
  unsigned in_kernel_ = 0;  // submitted, not yet reaped
  uint64_t next_sequence_ = 0;
  int broken_error_ = 0;       // the engine failed (backend_ is null)
  std::string broken_detail_;  // why, naming the oldest request then in flight
  bool halted_ = false;        // halt() ran
};

}  // namespace

class AioHandle::Impl final : public PartListener {
 public:
  Impl(AioConfig config, BackendFactory factory) : config_(std::move(config)) {
    config_.validate();
    if (!factory) factory = [](const AioConfig& c) { return make_backend(c); };
    std::vector<std::unique_ptr<Backend>> backends;
    for (int i = 0; i < config_.intra_op_parallelism; ++i) backends.push_back(factory(config_));
    backend_name_ = std::string(backends.front()->name());
    for (auto& backend : backends) {
      workers_.push_back(std::make_unique<Worker>(*this, std::move(backend), config_, stats_));
    }
    for (auto& worker : workers_) worker->start();
  }

  ~Impl() {
    for (auto& worker : workers_) worker->stop_and_join();
    size_t failed = 0;
    for (const auto& transfer : async_) failed += transfer->error ? 1 : 0;
    if (failed > 0) {
      spdlog::warn("aio: {} async transfer(s) failed and were never waited for", failed);
    }
  }

  const AioConfig& config() const noexcept { return config_; }
  std::string_view backend_name() const noexcept { return backend_name_; }

  void run_sync(Op op, std::byte* buffer, uint64_t bytes, const std::string& path,
                uint64_t offset) {
    if (std::exception_ptr error = broken_error(op, path, offset, bytes)) {
      std::rethrow_exception(error);
    }
    std::unique_ptr<Transfer> transfer = make_transfer(op, buffer, bytes, path, offset);
    start(transfer->parts.data(), transfer->parts.size());
    const Clock::time_point began = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_cv_.wait_until(lock, deadline_after(began), [&] { return transfer->done; })) {
      std::exception_ptr error = time_out_locked(*transfer, began);
      abandoned_.push_back(std::move(transfer));
      lock.unlock();
      cancel_workers();
      std::rethrow_exception(error);
    }
    if (transfer->error) std::rethrow_exception(transfer->error);
  }

  uint64_t run_async(Op op, std::byte* buffer, uint64_t bytes, const std::string& path,
                     uint64_t offset) {
    std::unique_ptr<Transfer> transfer;
    std::exception_ptr error = broken_error(op, path, offset, bytes);
    if (!error) {
      try {
        transfer = make_transfer(op, buffer, bytes, path, offset);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      // Reported by wait(), like every other failure of an async transfer.
      transfer = std::make_unique<Transfer>();
      transfer->done = true;
      transfer->error = std::move(error);
    }
    transfer->async = true;
    // Once published in async_, a transfer that is already done (no parts: it failed before
    // starting, or is empty) may be collected and freed by a wait() on another thread at any
    // moment, so nothing below touches the transfer itself: only its parts, which keep it
    // alive (not done) until the last of them has been enqueued and has ended.
    Part* const parts = transfer->parts.data();
    const size_t part_count = transfer->parts.size();
    uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ticket = ++last_ticket_;
      transfer->ticket = ticket;
      if (part_count > 0) ++async_outstanding_;
      async_.push_back(std::move(transfer));
    }
    start(parts, part_count);
    return ticket;
  }

  void wait_for(std::span<const uint64_t> tickets) {
    std::vector<std::unique_ptr<Transfer>> ended;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (uint64_t ticket : tickets) {
        if (ticket == 0 || ticket > last_ticket_) {
          throw std::invalid_argument("aio: wait_for: ticket " + std::to_string(ticket) +
                                      " was never issued by this handle");
        }
      }
      // A ticket no longer in async_ was collected by wait() or another wait_for().
      const auto all_ended = [&] {
        for (const auto& transfer : async_) {
          if (!transfer->done &&
              std::find(tickets.begin(), tickets.end(), transfer->ticket) != tickets.end()) {
            return false;
          }
        }
        return true;
      };
      const Clock::time_point began = Clock::now();
      if (!done_cv_.wait_until(lock, deadline_after(began), all_ended)) {
        // The lowest waited ticket not done is named; every waited transfer becomes the
        // handle's (the kernel may still use their memory), the others stay pending.
        const Transfer* stuck = nullptr;
        for (const auto& transfer : async_) {
          if (!transfer->done &&
              std::find(tickets.begin(), tickets.end(), transfer->ticket) != tickets.end() &&
              (stuck == nullptr || transfer->ticket < stuck->ticket)) {
            stuck = transfer.get();
          }
        }
        std::exception_ptr error = time_out_locked(*stuck, began);
        abandon_locked([&](const Transfer& t) {
          return std::find(tickets.begin(), tickets.end(), t.ticket) != tickets.end();
        });
        lock.unlock();
        cancel_workers();
        std::rethrow_exception(error);
      }
      for (auto it = async_.begin(); it != async_.end();) {
        if (std::find(tickets.begin(), tickets.end(), (*it)->ticket) != tickets.end()) {
          ended.push_back(std::move(*it));
          it = async_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& transfer : ended) {
      if (transfer->error) std::rethrow_exception(transfer->error);
    }
  }

  int wait() {
    std::vector<std::unique_ptr<Transfer>> ended;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const Clock::time_point began = Clock::now();
      if (!done_cv_.wait_until(lock, deadline_after(began),
                               [this] { return async_outstanding_ == 0; })) {
        const Transfer* stuck = nullptr;  // the oldest transfer not done
        for (const auto& transfer : async_) {
          if (!transfer->done) {
            stuck = transfer.get();
            break;
          }
        }
        std::exception_ptr error = time_out_locked(*stuck, began);
        abandon_locked([](const Transfer&) { return true; });
        lock.unlock();
        cancel_workers();
        std::rethrow_exception(error);
      }
      ended.swap(async_);
    }
    for (const auto& transfer : ended) {
      if (transfer->error) std::rethrow_exception(transfer->error);
    }
    return static_cast<int>(ended.size());
  }

  int pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(async_.size());
  }

  std::vector<std::string> buffered_paths() const { return files_.buffered_paths(); }

  AioStats stats() const {
    return AioStats{.bytes_read = stats_.bytes_read.load(std::memory_order_relaxed),
                    .bytes_written = stats_.bytes_written.load(std::memory_order_relaxed),
                    .requests = stats_.requests.load(std::memory_order_relaxed),
                    .bounced_bytes = stats_.bounced_bytes.load(std::memory_order_relaxed),
                    .fixed_requests = stats_.fixed_requests.load(std::memory_order_relaxed)};
  }

  bool register_buffers(std::span<const std::pair<void*, size_t>> ranges) {
    std::lock_guard<std::mutex> lock(registration_mutex_);
    std::vector<std::pair<uintptr_t, size_t>> next = registered_;
    for (const auto& [data, bytes] : ranges) {
      const auto begin = reinterpret_cast<uintptr_t>(data);
      if (data == nullptr || bytes == 0 || bytes > UINTPTR_MAX - begin) {
        throw std::invalid_argument("aio: register_buffers: a range is null, empty or wraps");
      }
      bool repeat = false;
      for (const auto& [other, other_bytes] : next) {
        if (other == begin && other_bytes == bytes) {
          repeat = true;
        } else if (begin < other + other_bytes && other < begin + bytes) {
          throw std::invalid_argument(
              "aio: register_buffers: a range overlaps a registered range it does not equal");
        }
      }
      if (!repeat) next.emplace_back(begin, bytes);
    }
    if (next.size() == registered_.size()) return fixed_in_use_;
    return publish(std::move(next));
  }

  void unregister_buffers(std::span<const std::pair<void*, size_t>> ranges) {
    std::lock_guard<std::mutex> lock(registration_mutex_);
    std::vector<std::pair<uintptr_t, size_t>> next = registered_;
    for (const auto& [data, bytes] : ranges) {
      std::erase(next, std::pair<uintptr_t, size_t>(reinterpret_cast<uintptr_t>(data), bytes));
    }
    if (next.size() != registered_.size()) publish(std::move(next));
  }

  void close_file(const std::string& path) { files_.close(path); }

  bool broken() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return broken_error_ != 0;
  }

  std::string broken_reason() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return broken_reason_;
  }

  void engine_failed(int error, const std::string& reason) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    set_broken_locked(error, reason);
  }

  void part_done(Part& part) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Transfer& transfer = *part.transfer;
    if (part.error && !transfer.error) transfer.error = part.error;
    if (--transfer.parts_left == 0) {
      transfer.done = true;
      if (transfer.async) --async_outstanding_;
      done_cv_.notify_all();
    }
  }

 private:
  using Clock = std::chrono::steady_clock;

  Clock::time_point deadline_after(Clock::time_point began) const {
    return began + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(config_.io_timeout_s));
  }

  // `transfer` did not end by its deadline: breaks the handle and returns the error to throw
  // (naming the transfer's range, the time waited and the deadline). Caller holds mutex_.
  std::exception_ptr time_out_locked(const Transfer& transfer, Clock::time_point began) {
    const double waited_s = std::chrono::duration<double>(Clock::now() - began).count();
    std::exception_ptr error = make_io_error(
        transfer.op, transfer.file->path, transfer.offset, transfer.bytes, ETIMEDOUT,
        fmt::format("no completion after {:.3f} s (io_timeout_s = {}); the handle is broken: "
                    "its requests in flight are cancelled, and their memory may be written "
                    "until the handle is destroyed",
                    waited_s, config_.io_timeout_s));
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      set_broken_locked(ETIMEDOUT, e.what());
    }
    return error;
  }

  // Moves the async transfers `chosen` picks from async_ to abandoned_: they are no longer
  // the caller's to collect, and are freed only once the workers have stopped. Caller holds
  // mutex_.
  template <typename Chosen>
  void abandon_locked(Chosen chosen) {
    for (auto it = async_.begin(); it != async_.end();) {
      if (!chosen(**it)) {
        ++it;
        continue;
      }
      if (!(*it)->done) --async_outstanding_;
      (*it)->async = false;  // part_done() no longer counts it in async_outstanding_
      abandoned_.push_back(std::move(*it));
      it = async_.erase(it);
    }
  }

  // Has every worker halt: fail its queued parts and cancel its requests in flight.
  void cancel_workers() {
    for (auto& worker : workers_) worker->request_cancel();
  }

  // Records the first reason the handle broke. Caller holds mutex_.
  void set_broken_locked(int error, const std::string& reason) noexcept {
    if (broken_error_ != 0) return;
    broken_error_ = error != 0 ? error : EIO;
    try {
      broken_reason_ = reason;
    } catch (...) {
      broken_reason_.clear();  // out of memory: broken() still says so
    }
  }

  // The error of a new transfer on a broken handle (null while it is not broken): its own
  // range, and why the handle broke.
  std::exception_ptr broken_error(Op op, const std::string& path, uint64_t offset,
                                  uint64_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_error_ == 0) return nullptr;
    return make_io_error(op, path, offset, bytes, broken_error_,
                         "the handle is broken (" + broken_reason_ + "); make a new handle");
  }

  // Opens the file and cuts [offset, offset + bytes) into one part per worker, boundaries on
  // 4096-byte file offsets. Throws IoError.
  std::unique_ptr<Transfer> make_transfer(Op op, std::byte* buffer, uint64_t bytes,
                                          const std::string& path, uint64_t offset) {
    constexpr auto kMaxOffset = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (offset > kMaxOffset || bytes > kMaxOffset - offset) {
      throw IoError(std::string(to_string(op)), path, offset, bytes, EFBIG,
                    "the range ends beyond the largest file offset");
    }
    if (buffer == nullptr && bytes > 0) {
      throw IoError(std::string(to_string(op)), path, offset, bytes, EFAULT, "null buffer");
    }
    auto transfer = std::make_unique<Transfer>();
    transfer->op = op;
    transfer->offset = offset;
    transfer->bytes = bytes;
    transfer->file = files_.get(path, op == Op::kWrite);
    const uint64_t count = workers_.size();
    const uint64_t end = offset + bytes;
    const bool congruent = (reinterpret_cast<uintptr_t>(buffer) - offset) % kBlock == 0;
    transfer->parts.reserve(count);
    uint64_t previous = offset;
    for (uint64_t i = 1; i <= count; ++i) {
      // offset + bytes * i / count, without overflowing 64 bits.
      const uint64_t share = bytes / count * i + bytes % count * i / count;
      const uint64_t boundary = i == count ? end : std::max(previous, align_down(offset + share));
      if (boundary > previous) {
        Part& part = transfer->parts.emplace_back();
        part.transfer = transfer.get();
        part.worker = static_cast<size_t>(i - 1);
        part.begin = previous;
        part.end = boundary;
        part.memory = buffer + (previous - offset);
        part.congruent = congruent;
      }
      previous = boundary;
    }
    transfer->parts_left = transfer->parts.size();
    transfer->done = transfer->parts.empty();
    return transfer;
  }

  // Hands parts[0, count) to their workers. Reads nothing of a part (nor of its transfer)
  // after enqueuing it: the last part may end, and its transfer be freed, at once.
  void start(Part* parts, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      Part* part = parts + i;
      Worker& worker = *workers_[part->worker];
      worker.enqueue(part);
    }
  }

  // Builds the engine table of `ranges`, has every worker apply it, and makes it current.
  // Returns whether every worker's engine uses it. Caller holds registration_mutex_.
  bool publish(std::vector<std::pair<uintptr_t, size_t>> ranges) {
    auto table = std::make_shared<BufferTable>();
    table->generation = ++generation_;
    for (const auto& [begin, bytes] : ranges) {
      for (uint64_t at = 0; at < bytes; at += kMaxFixedBufferBytes) {
        const uint64_t piece = std::min<uint64_t>(bytes - at, kMaxFixedBufferBytes);
        table->by_address.push_back(
            BufferTable::Range{.begin = begin + at,
                               .end = begin + at + piece,
                               .index = static_cast<int>(table->iovecs.size())});
        table->iovecs.push_back(
            iovec{reinterpret_cast<void*>(begin + at), static_cast<size_t>(piece)});
      }
    }
    std::sort(
        table->by_address.begin(), table->by_address.end(),
        [](const BufferTable::Range& a, const BufferTable::Range& b) { return a.begin < b.begin; });
    for (auto& worker : workers_) worker->post_buffer_table(table);
    bool fixed = !table->iovecs.empty();
    for (auto& worker : workers_) fixed = worker->wait_buffer_table(table->generation) && fixed;
    registered_ = std::move(ranges);
    fixed_in_use_ = fixed;
    return fixed;
  }

  AioConfig config_;
  std::string backend_name_;
  SharedStats stats_;
  FileCache files_;
  std::vector<std::unique_ptr<Worker>> workers_;

  std::mutex registration_mutex_;                         // serializes register/unregister_buffers
  std::vector<std::pair<uintptr_t, size_t>> registered_;  // guarded by registration_mutex_
  uint64_t generation_ = 0;                               // guarded by registration_mutex_
  bool fixed_in_use_ = false;                             // guarded by registration_mutex_

  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  std::vector<std::unique_ptr<Transfer>> async_;  // guarded by mutex_; not yet collected
  size_t async_outstanding_ = 0;                  // guarded by mutex_; async_ not yet done
  uint64_t last_ticket_ = 0;                      // guarded by mutex_; tickets are 1, 2, ...
  // Guarded by mutex_: transfers whose wait timed out; freed after the workers stopped.
  std::vector<std::unique_ptr<Transfer>> abandoned_;
  int broken_error_ = 0;       // guarded by mutex_; 0: not broken
  std::string broken_reason_;  // guarded by mutex_
};

AioHandle::AioHandle(AioConfig config) : AioHandle(std::move(config), nullptr) {}

AioHandle::AioHandle(AioConfig config, BackendFactory factory)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(factory))) {}

AioHandle::~AioHandle() = default;

const AioConfig& AioHandle::config() const noexcept { return impl_->config(); }

std::string_view AioHandle::backend_name() const noexcept { return impl_->backend_name(); }

void AioHandle::pread(void* buffer, uint64_t bytes, const std::string& path, uint64_t file_offset) {
  impl_->run_sync(Op::kRead, static_cast<std::byte*>(buffer), bytes, path, file_offset);
}

void AioHandle::pwrite(const void* buffer, uint64_t bytes, const std::string& path,
                       uint64_t file_offset) {
  // Writes only read from the buffer; the shared transfer type holds a mutable pointer.
  impl_->run_sync(Op::kWrite, static_cast<std::byte*>(const_cast<void*>(buffer)), bytes, path,
                  file_offset);
}

uint64_t AioHandle::async_pread(void* buffer, uint64_t bytes, const std::string& path,
                                uint64_t file_offset) {
  return impl_->run_async(Op::kRead, static_cast<std::byte*>(buffer), bytes, path, file_offset);
}

uint64_t AioHandle::async_pwrite(const void* buffer, uint64_t bytes, const std::string& path,
                                 uint64_t file_offset) {
  return impl_->run_async(Op::kWrite, static_cast<std::byte*>(const_cast<void*>(buffer)), bytes,
                          path, file_offset);
}

int AioHandle::wait() { return impl_->wait(); }

void AioHandle::wait_for(uint64_t ticket) {
  impl_->wait_for(std::span<const uint64_t>(&ticket, 1));
}

void AioHandle::wait_for(std::span<const uint64_t> tickets) { impl_->wait_for(tickets); }

int AioHandle::pending() const { return impl_->pending(); }

std::vector<std::string> AioHandle::buffered_paths() const { return impl_->buffered_paths(); }

AioStats AioHandle::stats() const { return impl_->stats(); }

bool AioHandle::register_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  return impl_->register_buffers(ranges);
}

void AioHandle::unregister_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  impl_->unregister_buffers(ranges);
}

bool AioHandle::broken() const { return impl_->broken(); }

std::string AioHandle::broken_reason() const { return impl_->broken_reason(); }

void AioHandle::close_file(const std::string& path) { impl_->close_file(path); }

}  // namespace zinf::aio
