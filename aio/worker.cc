// Worker: the I/O loop of one AioHandle thread (see aio/worker.h).
#include "aio/worker.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "aio/request_plan.h"

namespace zinf::aio::internal {
namespace {

// Consecutive EINTR/EAGAIN results, or continuations that made no progress, tolerated for
// one request before it fails.
constexpr int kMaxRetries = 32;

// Failed waits while draining a failed engine retried at once before each waits 10 ms.
constexpr uint64_t kDrainFailuresBeforeBackoff = 64;

constexpr std::string_view kHaltedDetail =
    "cancelled: a wait on this handle timed out (the handle is broken)";

}  // namespace

void Worker::enqueue(Part* part) {
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

void Worker::post_buffer_table(std::shared_ptr<const BufferTable> table) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_table_ = std::move(table);
    wake_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

bool Worker::wait_buffer_table(uint64_t generation) {
  std::unique_lock<std::mutex> lock(mutex_);
  applied_cv_.wait(lock, [&] { return applied_generation_ >= generation; });
  return applied_fixed_;
}

void Worker::request_cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_requested_.store(true, std::memory_order_release);
    wake_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

void Worker::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Worker::run() noexcept {
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

bool Worker::take_new_parts() {
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

void Worker::apply_buffer_table() {
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

void Worker::fill() {
  for (Part* part = active_head_; part != nullptr; part = part->next) {
    if (broken_error_ != 0 && !part->error) fail_part(*part, broken_error_, broken_detail_);
    if (halted_ && !part->error) fail_part(*part, ECANCELED, kHaltedDetail);
    while (!free_.empty() && !part->error && part->cursor < part->end) issue_next(*part);
    if (free_.empty()) break;
  }
}

void Worker::issue_next(Part& part) {
  const Transfer& transfer = *part.transfer;
  const FileEntry& file = *transfer.file;
  const unsigned index = free_.back();
  Slot& slot = slots_[index];
  const uint64_t at = part.cursor;
  std::byte* user = part.memory + (at - part.begin);
  const RequestPlan plan = plan_request(transfer.op, file, part, request_bytes_, slot_bytes_);
  std::byte* memory = user;
  if (plan.staged) {
    memory = staging_.slot(index);
    if (memory == nullptr) {
      fail_part(part, ENOMEM, "allocating staging memory");
      return;
    }
    if (transfer.op == Op::kWrite) std::memcpy(memory, user, plan.covered);
  }

  free_.pop_back();
  ++part.in_flight;
  slot.sequence = next_sequence_++;
  part.cursor = at + plan.covered;
  slot.part = &part;
  const int buffer_index = table_ && !plan.staged ? table_->find(memory, plan.length) : -1;
  slot.request = Request{.op = transfer.op,
                         .fd = plan.fd,
                         .buffer_index = buffer_index,
                         .buffer = memory,
                         .bytes = static_cast<uint32_t>(plan.length),
                         .offset = plan.offset,
                         .tag = index,
                         .path = file.path};
  slot.memory = memory;
  slot.origin_offset = plan.offset;
  slot.origin_memory = memory;
  slot.need_end = at + plan.covered;
  slot.user_begin = at;
  slot.user_memory = user;
  slot.staged = plan.staged;
  slot.direct = plan.direct;
  slot.retries = 0;
  stage(slot);
}

void Worker::stage(Slot& slot) {
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

void Worker::submit_staged() {
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

void Worker::reap() {
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

void Worker::on_complete(Slot& slot, int64_t result) {
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
    fail_request(slot, 0, "unexpected end of file (the file ends before the requested range does)",
                 std::max(reached, slot.user_begin),
                 slot.need_end - std::max(reached, slot.user_begin));
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

void Worker::finish_request(Slot& slot) {
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

void Worker::fail_request(Slot& slot, int error, std::string_view detail) {
  const uint64_t offset = std::max(slot.request.offset, slot.user_begin);
  fail_request(slot, error, detail, offset, slot.need_end - std::min(offset, slot.need_end));
}

void Worker::fail_request(Slot& slot, int error, std::string_view detail, uint64_t offset,
                          uint64_t length) {
  Part& part = *slot.part;
  if (!part.error) {
    part.error =
        make_io_error(slot.request.op, part.transfer->file->path, offset, length, error, detail);
  }
  release(slot);
}

void Worker::fail_part(Part& part, int error, std::string_view detail) {
  if (!part.error) {
    part.error = make_io_error(part.transfer->op, part.transfer->file->path, part.cursor,
                               part.end - part.cursor, error, detail);
  }
}

void Worker::release(Slot& slot) {
  --slot.part->in_flight;
  slot.part = nullptr;
  free_.push_back(static_cast<unsigned>(&slot - slots_.data()));
}

void Worker::fail_engine(int error, std::string_view detail) {
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

void Worker::drain() noexcept {
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

void Worker::halt() {
  halted_ = true;
  if (backend_ && in_kernel_ > 0) (void)backend_->cancel();
  for (Part* part = active_head_; part != nullptr; part = part->next) {
    fail_part(*part, ECANCELED, kHaltedDetail);
  }
}

void Worker::retire_done_parts() {
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

}  // namespace zinf::aio::internal
