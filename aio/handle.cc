// AioHandle: the façade over its workers (see aio/handle.h). It owns the transfers: opens
// the file, has request_plan.h cut each into parts for the workers (aio/worker.h), collects
// them in wait()/wait_for() under a deadline, and keeps the handle's broken state. Request
// shapes live in aio/request_plan.h, bounce memory in aio/bounce.h, the I/O loop in
// aio/worker.h, the registered-buffer table in aio/buffer_table.h.
#include "aio/handle.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "aio/backend.h"
#include "aio/buffer_table.h"
#include "aio/error.h"
#include "aio/file_cache.h"
#include "aio/request_plan.h"
#include "aio/transfer.h"
#include "aio/worker.h"

namespace zinf::aio {

using internal::BufferTable;
using internal::make_buffer_table;
using internal::make_io_error;
using internal::Part;
using internal::PartListener;
using internal::SharedStats;
using internal::split_into_parts;
using internal::Transfer;
using internal::Worker;

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
    split_into_parts(*transfer, buffer, workers_.size());
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
    std::shared_ptr<const BufferTable> table = make_buffer_table(++generation_, ranges);
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
