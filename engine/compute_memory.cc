#include "engine/compute_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
#define ZINF_HAS_DEVICE_ALLOCATOR_STATS 1
#endif

namespace zinf::engine {
namespace {

// Counts the bytes of every live allocation made through it and forwards to the CPU allocator
// that was current when it was installed. Its DataPtrs keep data == context, as the default
// allocator's do (raw_allocate relies on it); the size and the original deleter of each live
// pointer are kept in a table.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return wrap(inner_->allocate(n), n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(inner_->allocate(n), n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override {
    return inner_->raw_deleter() != nullptr ? &release : nullptr;
  }

  ComputeMemory figures() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {true, in_use_, peak_};
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = in_use_;
  }

 private:
  struct Live {
    size_t bytes;
    c10::DeleterFnPtr deleter;
  };

  c10::DataPtr wrap(c10::DataPtr inner, size_t n) const {
    void* p = inner.get();
    // Only simple pointers (context == data, a plain deleter) can be taken over; anything
    // else is handed back uncounted.
    if (p == nullptr || inner.get_context() != p || inner.get_deleter() == nullptr) {
      return inner;
    }
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    const c10::Device device = inner.device();
    (void)inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[p] = {n, deleter};
      in_use_ += n;
      peak_ = std::max(peak_, in_use_);
    }
    return {p, p, &release, device};
  }

  static void release(void* p);

  c10::Allocator* const inner_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Live> live_;  // guarded by mutex_
  mutable uint64_t in_use_ = 0;                   // guarded by mutex_
  mutable uint64_t peak_ = 0;                     // guarded by mutex_
};

// Never destroyed: tensors may be freed during static destruction.
CountingCpuAllocator* counting = nullptr;
std::once_flag install_once;

void CountingCpuAllocator::release(void* p) {
  c10::DeleterFnPtr deleter = nullptr;
  {
    std::lock_guard<std::mutex> lock(counting->mutex_);
    auto it = counting->live_.find(p);
    if (it == counting->live_.end()) return;  // not ours: cannot happen, but never crash
    deleter = it->second.deleter;
    counting->in_use_ -= it->second.bytes;
    counting->live_.erase(it);
  }
  deleter(p);
}

#ifdef ZINF_HAS_DEVICE_ALLOCATOR_STATS
// zinf's CUDA compute device always names its ordinal; a bare "cuda" means the first.
c10::DeviceIndex cuda_index(const c10::Device& device) {
  return device.has_index() ? device.index() : c10::DeviceIndex{0};
}
#endif

}  // namespace

void track_compute_memory() {
  std::call_once(install_once, [] {
    counting = new CountingCpuAllocator(c10::GetCPUAllocator());
    // Above the default allocator's priority (0), so a later default registration cannot
    // replace it.
    c10::SetCPUAllocator(counting, /*priority=*/1);
  });
}

ComputeMemory compute_memory(const c10::Device& device) {
  if (device.is_cpu()) {
    return counting != nullptr ? counting->figures() : ComputeMemory{};
  }
#ifdef ZINF_HAS_DEVICE_ALLOCATOR_STATS
  if (device.is_cuda()) {
    const auto stats =
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(cuda_index(device));
    const auto& bytes =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return {true, static_cast<uint64_t>(std::max<int64_t>(bytes.current, 0)),
            static_cast<uint64_t>(std::max<int64_t>(bytes.peak, 0))};
  }
#endif
  return {};
}

void reset_compute_peak(const c10::Device& device) {
  if (device.is_cpu()) {
    if (counting != nullptr) counting->reset_peak();
    return;
  }
#ifdef ZINF_HAS_DEVICE_ALLOCATOR_STATS
  if (device.is_cuda()) {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(cuda_index(device));
  }
#endif
}

}  // namespace zinf::engine
