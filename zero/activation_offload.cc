#include "zero/activation_offload.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aio/pinned_buffer.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t round_page(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct ActivationOffload::State {
  // One saved input.
  struct Entry {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    c10::Device device = c10::Device(c10::kCPU);
    uint64_t bytes = 0;
    std::optional<size_t> slot;    // cpu: its copy; nvme: its write's staging, then its read's
    bool has_extent = false;       // nvme
    offload::ExtentId extent = 0;  // nvme
    bool writing = false;          // nvme: its write is queued and not waited for
    bool reading = false;          // nvme: its read is queued and not waited for
    bool loaded = false;           // nvme: its read is done: `slot` holds its bytes
  };

  OffloadTarget tier = OffloadTarget::kCpu;
  offload::NvmeStore* store = nullptr;

  mutable std::mutex mutex;
  bool closed = false;                                 // guarded by mutex
  uint64_t next_id = 0;                                // guarded by mutex
  std::map<uint64_t, Entry> entries;                   // guarded by mutex; by id, save order
  std::vector<aio::PinnedBuffer> slots;                // guarded by mutex
  std::vector<bool> slot_free;                         // guarded by mutex
  std::multimap<uint64_t, offload::ExtentId> extents;  // guarded by mutex: free, by bytes
  std::vector<offload::ExtentId> all_extents;          // guarded by mutex
  std::unique_ptr<offload::NvmeStore::Queue> writes;   // guarded by mutex
  std::unique_ptr<offload::NvmeStore::Queue> reads;    // guarded by mutex
  std::optional<std::string> failure;                  // guarded by mutex
  uint64_t held_bytes = 0;                             // guarded by mutex
  ActivationOffloadStats stats;                        // guarded by mutex

  // ---- all below: the caller holds `mutex` ----

  void check_failure() const {
    if (failure) {
      throw ZeroError(fmt::format("activation offload failed earlier: {}", *failure));
    }
  }

  // A free pinned buffer of at least `bytes`: the smallest that fits; else a free one too small
  // is replaced by one that fits, so there are never more buffers than were in use at once.
  size_t acquire_slot(uint64_t bytes) {
    std::optional<size_t> best;
    std::optional<size_t> small;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!slot_free[i]) continue;
      if (slots[i].size() >= bytes) {
        if (!best || slots[i].size() < slots[*best].size()) best = i;
      } else {
        small = i;
      }
    }
    if (best) {
      slot_free[*best] = false;
      return *best;
    }
    aio::PinnedBuffer buffer(round_page(bytes));
    stats.pinned_bytes += buffer.capacity();
    if (small) {
      stats.pinned_bytes -= slots[*small].capacity();
      slots[*small] = std::move(buffer);
      slot_free[*small] = false;
      return *small;
    }
    slots.push_back(std::move(buffer));
    slot_free.push_back(false);
    return slots.size() - 1;
  }
  void release_slot(std::optional<size_t>& slot) {
    if (slot) slot_free[*slot] = true;
    slot.reset();
  }

  // An extent of exactly `bytes` (a whole-extent transfer moves the allocated bytes).
  offload::ExtentId acquire_extent(uint64_t bytes) {
    auto it = extents.find(bytes);
    if (it != extents.end()) {
      const offload::ExtentId id = it->second;
      extents.erase(it);
      return id;
    }
    const offload::ExtentId id = store->allocate(bytes);
    all_extents.push_back(id);
    stats.nvme_bytes += store->extent(id).capacity;
    return id;
  }

  // Waits for the transfers queued on `queue`, then settles every entry whose `in_flight`
  // flag is set: a read that succeeded leaves the input's bytes in its buffer; a write (done
  // or failed) and a failed read free the buffer.
  void wait_for(offload::NvmeStore::Queue* queue, bool Entry::*in_flight, double& waited_seconds) {
    if (queue == nullptr || queue->pending() == 0) return;
    const auto start = std::chrono::steady_clock::now();
    try {
      queue->wait();
    } catch (...) {
      settle(in_flight, /*ok=*/false);
      throw;
    }
    settle(in_flight, /*ok=*/true);
    waited_seconds += seconds_since(start);
  }
  void settle(bool Entry::*in_flight, bool ok) {
    const bool read = in_flight == &Entry::reading;
    for (auto& [id, e] : entries) {
      if (!(e.*in_flight)) continue;
      e.*in_flight = false;
      if (read && ok) {
        e.loaded = true;
      } else {
        release_slot(e.slot);
      }
    }
  }
  void wait_writes() { wait_for(writes.get(), &Entry::writing, stats.write_wait_seconds); }
  void wait_reads() { wait_for(reads.get(), &Entry::reading, stats.read_wait_seconds); }

  // Forgets entry `it`: its buffer and extent go back for reuse. No transfer of it may be in
  // flight.
  void erase(std::map<uint64_t, Entry>::iterator it) {
    Entry& e = it->second;
    release_slot(e.slot);
    if (e.has_extent) extents.emplace(e.bytes, e.extent);
    held_bytes -= e.bytes;
    entries.erase(it);
  }

  // A token dropped with its graph: frees the entry if restore() did not.
  void drop(uint64_t id) noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    if (closed) return;
    auto it = entries.find(id);
    if (it == entries.end()) return;
    try {
      if (it->second.writing) wait_writes();
      if (it->second.reading) wait_reads();
    } catch (const std::exception& ex) {
      if (!failure) failure = ex.what();
    }
    erase(entries.find(id));
  }
};

ActivationOffload::ActivationOffload(OffloadTarget tier, offload::NvmeStore* store)
    : state_(std::make_shared<State>()) {
  if (tier != OffloadTarget::kCpu && tier != OffloadTarget::kNvme) {
    throw ZeroError("activation offload needs the tier \"cpu\" or \"nvme\"");
  }
  if (tier == OffloadTarget::kNvme && store == nullptr) {
    throw ZeroError("activation offload to nvme needs a swap file");
  }
  state_->tier = tier;
  state_->store = store;
  if (tier == OffloadTarget::kNvme) {
    state_->writes = store->make_queue();
    state_->reads = store->make_queue();
  }
}

ActivationOffload::~ActivationOffload() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  for (auto* q : {s.writes.get(), s.reads.get()}) {
    if (q == nullptr || q->pending() == 0) continue;
    try {
      q->wait();
    } catch (const std::exception& ex) {
      spdlog::warn("activation offload: a transfer failed at shutdown: {}", ex.what());
    }
  }
  s.writes.reset();
  s.reads.reset();
  if (s.store != nullptr) {
    for (offload::ExtentId id : s.all_extents) s.store->free(id);
  }
  s.entries.clear();
  s.slots.clear();
  s.closed = true;
}

at::Tensor ActivationOffload::save(const at::Tensor& x) {
  State& s = *state_;
  State::Entry e;
  e.shape = x.sizes().vec();
  e.dtype = x.scalar_type();
  e.device = x.device();
  e.bytes = static_cast<uint64_t>(x.numel()) * x.element_size();
  size_t slot = 0;
  std::byte* staging = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_failure();
    slot = s.acquire_slot(e.bytes);
    staging = s.slots[slot].data();
  }
  // The copy off the device (a GPU: a blocking copy into pinned memory) needs no lock: the
  // slot is this call's alone.
  try {
    at::from_blob(staging, e.shape, at::TensorOptions().dtype(e.dtype)).copy_(x);
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.slot_free[slot] = true;
    throw;
  }

  std::lock_guard<std::mutex> lock(s.mutex);
  e.slot = slot;
  const uint64_t id = s.next_id++;
  auto [it, inserted] = s.entries.emplace(id, std::move(e));
  (void)inserted;
  State::Entry& entry = it->second;
  s.held_bytes += entry.bytes;
  if (s.tier == OffloadTarget::kNvme) {
    try {
      // One write in flight at a time: the previous input's write ran during the previous
      // block's forward.
      s.wait_writes();
      entry.extent = s.acquire_extent(entry.bytes);
      entry.has_extent = true;
      s.writes->async_write(entry.extent, staging);
      entry.writing = true;
    } catch (...) {
      if (!entry.writing) s.erase(it);
      throw;
    }
  }
  ++s.stats.saved;
  s.stats.saved_bytes += entry.bytes;
  s.stats.largest_saved = std::max(s.stats.largest_saved, s.held_bytes);

  // The token: one int64 (the id) whose storage's end drops the entry.
  auto* cell = new int64_t(static_cast<int64_t>(id));
  std::weak_ptr<State> weak = state_;
  return at::from_blob(
      cell, {1},
      [weak, id](void* p) {
        delete static_cast<int64_t*>(p);
        if (auto state = weak.lock()) state->drop(id);
      },
      at::TensorOptions().dtype(at::kLong));
}

at::Tensor ActivationOffload::restore(const at::Tensor& token) {
  State& s = *state_;
  const auto id = static_cast<uint64_t>(token.data_ptr<int64_t>()[0]);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.check_failure();
  auto it = s.entries.find(id);
  if (it == s.entries.end()) {
    throw ZeroError(fmt::format(
        "a block's saved input {} was restored already: a second backward through the same "
        "graph (retain_graph) is not supported with zinf.activation_offload",
        id));
  }
  State::Entry& e = it->second;
  if (s.tier == OffloadTarget::kNvme) {
    s.wait_writes();  // the backward starts: the last inputs' writes must be done
    if (e.reading || e.loaded) {
      ++s.stats.prefetched;
    } else {
      e.slot = s.acquire_slot(e.bytes);
      s.reads->async_read(e.extent, s.slots[*e.slot].data());
      e.reading = true;
    }
    s.wait_reads();
  }
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype).device(e.device));
  out.copy_(at::from_blob(s.slots[*e.slot].data(), e.shape, at::TensorOptions().dtype(e.dtype)));
  ++s.stats.restored;
  s.erase(it);

  // The next backward's input: the one saved just before this one, still off the device.
  if (s.tier == OffloadTarget::kNvme) {
    auto prev = s.entries.lower_bound(id);
    if (prev != s.entries.begin()) {
      --prev;
      State::Entry& p = prev->second;
      if (!p.reading && !p.loaded && !p.writing) {
        p.slot = s.acquire_slot(p.bytes);
        s.reads->async_read(p.extent, s.slots[*p.slot].data());
        p.reading = true;
      }
    }
  }
  return out;
}

OffloadTarget ActivationOffload::tier() const noexcept { return state_->tier; }

ActivationOffloadStats ActivationOffload::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

offload::Footprint ActivationOffload::footprint(OffloadTarget tier, uint64_t input_bytes,
                                                uint64_t saved_inputs) {
  offload::Footprint f;
  const uint64_t buffer = offload::pinned_allocation(input_bytes);
  switch (saved_inputs == 0 ? OffloadTarget::kNone : tier) {
    case OffloadTarget::kNone:
      break;
    case OffloadTarget::kCpu:
      f.device = input_bytes;
      f.pinned = saved_inputs * buffer;
      break;
    case OffloadTarget::kNvme:
      f.device = input_bytes;
      f.pinned = std::min<uint64_t>(2, saved_inputs) * buffer;
      f.nvme = saved_inputs * offload::swap_extent(input_bytes);
      break;
  }
  return f;
}

}  // namespace zinf::zero
