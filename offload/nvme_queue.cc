// NvmeStore::Queue: a batch of asynchronous extent transfers on its own aio handles, one per
// swap folder (see nvme_store.h for the contract).
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "aio/error.h"
#include "offload/error.h"
#include "offload/nvme_store.h"

namespace zinf::offload {
namespace {

uint64_t hash_of(const void* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

std::string hex(uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

NvmeStore::Queue::Queue(NvmeStore& store) : store_(store), lanes_(store.devices_.size()) {
  for (Lane& lane : lanes_) {
    lane.io = make_handle();
  }
}

std::unique_ptr<aio::AioHandle> NvmeStore::Queue::make_handle() const {
  return store_.config_.backend_factory
             ? std::make_unique<aio::AioHandle>(store_.config_.aio, store_.config_.backend_factory)
             : std::make_unique<aio::AioHandle>(store_.config_.aio);
}

aio::AioHandle& NvmeStore::Queue::handle(size_t device) {
  Lane& lane = lanes_[device];
  if (!lane.io) {
    lane.io = make_handle();
    if (!registered_.empty()) {
      (void)lane.io->register_buffers(registered_);  // transfers work either way
    }
  }
  return *lane.io;
}

void NvmeStore::Queue::submit(bool is_write, void* buffer, uint64_t bytes, uint64_t offset,
                              size_t& queued) {
  const size_t n = lanes_.size();
  auto* memory = static_cast<std::byte*>(buffer);
  const auto queue_piece = [&](size_t device, uint64_t piece, uint64_t file_offset) {
    const std::string& path = store_.devices_[device].path;
    if (is_write) {
      handle(device).async_pwrite(memory, piece, path, file_offset);
    } else {
      handle(device).async_pread(memory, piece, path, file_offset);
    }
    ++queued;
  };
  if (n == 1) {
    queue_piece(0, bytes, offset);  // the logical offset is the file offset
    return;
  }
  // Stripe unit k of the logical space lies in file k mod n, at (k div n) * unit.
  const uint64_t unit = store_.config_.stripe_bytes;
  while (bytes > 0) {
    const uint64_t k = offset / unit;
    const uint64_t within = offset % unit;
    const uint64_t piece = std::min(bytes, unit - within);
    queue_piece(static_cast<size_t>(k % n), piece, (k / n) * unit + within);
    memory += piece;
    offset += piece;
    bytes -= piece;
  }
}

NvmeStore::Queue::~Queue() {
  if (pending_.empty()) {
    return;
  }
  try {
    wait();  // never abandon buffers the kernel may still write
  } catch (const std::exception& e) {
    spdlog::error("zinf offload: swap transfers abandoned at queue destruction: {}", e.what());
  }
}

void NvmeStore::Queue::async_read(ExtentId id, void* buffer) {
  uint64_t bytes = 0;
  {
    std::lock_guard lock(store_.mutex_);
    bytes = store_.extents_.size() > id ? store_.extents_[id].info.bytes : 0;
  }
  async_transfer(id, 0, bytes, buffer, /*is_write=*/false);
}

void NvmeStore::Queue::async_write(ExtentId id, const void* buffer) {
  uint64_t bytes = 0;
  {
    std::lock_guard lock(store_.mutex_);
    bytes = store_.extents_.size() > id ? store_.extents_[id].info.bytes : 0;
  }
  async_transfer(id, 0, bytes, const_cast<void*>(buffer), /*is_write=*/true);
}

void NvmeStore::Queue::async_transfer(ExtentId id, uint64_t offset, uint64_t bytes, void* buffer,
                                      bool is_write) {
  Pending pending{id, is_write, buffer, offset, bytes, 0, false, 0};
  {
    std::lock_guard lock(store_.mutex_);
    Extent& extent = store_.checked(id, offset, bytes, is_write ? "write" : "read");
    pending.file_offset = extent.info.file_offset + offset;
    const bool whole = offset == 0 && bytes == extent.info.bytes;
    if (is_write) {
      if (!whole && extent.state != ExtentState::kValid) {
        throw OffloadError(ErrorKind::kUsage,
                           "partial write to an extent without valid contents in " + store_.label_ +
                               " at offset " + std::to_string(extent.info.file_offset));
      }
      store_.reserve_locked(extent.info.file_offset + extent.info.capacity);
      extent.in_flight_write = true;
    } else {
      if (extent.state == ExtentState::kEmpty) {
        throw OffloadError(ErrorKind::kUsage, "read of a never-written extent in " + store_.label_ +
                                                  " at offset " +
                                                  std::to_string(extent.info.file_offset));
      }
      if (extent.state == ExtentState::kTorn) {
        throw OffloadError(ErrorKind::kCorrupt,
                           "extent in swap file " + store_.label_ + " at offset " +
                               std::to_string(extent.info.file_offset) + " (" +
                               std::to_string(extent.info.bytes) +
                               " bytes) is torn: its last write did not complete");
      }
      if (store_.config_.checksums && whole) {
        pending.verify = true;
        pending.checksum = extent.checksum;
      }
    }
  }
  if (is_write && store_.config_.checksums) {
    pending.checksum = hash_of(buffer, bytes);  // the source must stay untouched until wait
  }
  pending_.push_back(pending);
  size_t queued = 0;
  try {
    submit(is_write, buffer, bytes, pending.file_offset, queued);
  } catch (const std::exception& e) {
    if (queued > 0) {  // some pieces are in flight already: wait() must collect them
      if (!submit_error_) {
        submit_error_ = "queueing a transfer on swap file(s) " + store_.label_ + " at offset " +
                        std::to_string(pending.file_offset) + " failed: " + e.what();
      }
      return;
    }
    pending_.pop_back();
    if (is_write) {
      std::lock_guard lock(store_.mutex_);
      store_.extents_[id].in_flight_write = false;
    }
    throw;
  }
}

void NvmeStore::Queue::wait() {
  std::optional<OffloadError> error;
  if (submit_error_) {
    error.emplace(ErrorKind::kIo, *submit_error_);
    submit_error_.reset();
  }
  const LaneTotals totals = collect_lanes(error);
  // Verify reads outside the store's lock: hashing is the expensive part.
  if (!error) {
    verify_reads(error);
  }
  settle(totals, error);
  pending_.clear();
  if (error) {
    throw *error;
  }
}

NvmeStore::Queue::LaneTotals NvmeStore::Queue::collect_lanes(std::optional<OffloadError>& error) {
  LaneTotals totals;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (!lane.io) {
      continue;  // replaced after a failure, and nothing queued on it since
    }
    const bool failed = wait_lane(i, error);
    const aio::AioStats io_stats = lane.io->stats();
    totals.requests += io_stats.requests - lane.reported.requests;
    totals.fixed_requests += io_stats.fixed_requests - lane.reported.fixed_requests;
    lane.reported = io_stats;
    // Whether the file went buffered is known once this handle has opened it.
    if (!lane.checked_buffered && !pending_.empty()) {
      lane.checked_buffered = true;
      totals.buffered = totals.buffered || !lane.io->buffered_paths().empty();
    }
    if (failed) {
      // Whether the engine broke, a request timed out or one request failed cannot be told
      // apart reliably from here: the handle is replaced in every case (it has nothing in
      // flight now), so a broken engine never serves a later transfer.
      spdlog::warn("zinf offload: replacing the aio handle of a queue on {} after an error",
                   store_.devices_[i].path);
      lane = Lane{};
    }
  }
  return totals;
}

bool NvmeStore::Queue::wait_lane(size_t device, std::optional<OffloadError>& error) {
  try {
    (void)lanes_[device].io->wait();
    return false;
  } catch (const aio::IoError& e) {
    std::string message = std::string("I/O error on swap file: ") + e.what();
    if (e.error() == ENOSPC) {
      std::lock_guard lock(store_.mutex_);
      message += store_.devices_[device].no_fallocate
                     ? "; the file system has no fallocate, so the swap file's space could "
                       "not be reserved in advance: free space there or choose another "
                       "nvme_path"
                     : "; the file system is full";
    }
    if (!error) {
      error.emplace(ErrorKind::kIo, message);
    }
  } catch (const std::exception& e) {
    if (!error) {
      error.emplace(ErrorKind::kIo,
                    "I/O error on swap file " + store_.devices_[device].path + ": " + e.what());
    }
  }
  return true;
}

void NvmeStore::Queue::verify_reads(std::optional<OffloadError>& error) const {
  for (const Pending& p : pending_) {
    if (p.is_write || !p.verify) {
      continue;
    }
    const uint64_t actual = hash_of(p.buffer, p.bytes);
    if (actual != p.checksum) {
      error.emplace(ErrorKind::kCorrupt, "checksum mismatch in swap file " + store_.label_ +
                                             " at offset " + std::to_string(p.file_offset) + " (" +
                                             std::to_string(p.bytes) + " bytes): written xxh3 " +
                                             hex(p.checksum) + ", read " + hex(actual));
      return;
    }
  }
}

void NvmeStore::Queue::settle(const LaneTotals& totals, const std::optional<OffloadError>& error) {
  std::lock_guard lock(store_.mutex_);
  store_.buffered_ = store_.buffered_ || totals.buffered;
  store_.io_requests_ += totals.requests;
  store_.fixed_io_requests_ += totals.fixed_requests;
  for (const Pending& p : pending_) {
    Extent& extent = store_.extents_[p.id];
    if (p.is_write) {
      extent.in_flight_write = false;
      if (error && error->kind() == ErrorKind::kIo) {
        extent.state = ExtentState::kTorn;  // which write failed is unknown: all suspect
      } else {
        extent.state = ExtentState::kValid;
        if (p.offset == 0 && p.bytes == extent.info.bytes) {
          extent.checksum = p.checksum;
        }
        store_.bytes_written_ += p.bytes;
        ++store_.writes_;
      }
    } else if (!error) {
      store_.bytes_read_ += p.bytes;
      ++store_.reads_;
    }
  }
}

bool NvmeStore::Queue::register_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  bool fixed = true;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    fixed = handle(i).register_buffers(ranges) && fixed;
  }
  for (const auto& range : ranges) {
    if (std::find(registered_.begin(), registered_.end(), range) == registered_.end()) {
      registered_.push_back(range);
    }
  }
  return fixed;
}

void NvmeStore::Queue::unregister_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  for (const auto& range : ranges) {
    registered_.erase(std::remove(registered_.begin(), registered_.end(), range),
                      registered_.end());
  }
  for (Lane& lane : lanes_) {
    if (lane.io) {
      lane.io->unregister_buffers(ranges);
    }
  }
}

}  // namespace zinf::offload
