// CudaAccelerator: an Accelerator on the CUDA runtime API (streams, events,
// cudaMemcpyAsync, cudaHostRegister), called from plain C++ so no CUDA compiler is needed.
// Built into zinf_offload when the CUDA toolkit is found (ZINF_HAVE_CUDA); the header is
// always usable and cuda_device_count() answers 0 when CUDA support is not built.
//
// The memory budget defaults to the device's total memory; a smaller budget makes the
// offload tier behave as on a smaller device. Host memory registered by register_host (or
// by the pin hooks) is page-locked for the driver; a range that is already registered
// (e.g. by the hooks and then by a pool) is accepted and unregistered only by whoever
// registered it first.
//
// Device memory is cached: a freed buffer goes to a free list by size, and an allocation of
// the same size takes it back (after the work LibTorch had queued on the default stream when
// it was freed, which may still read it), so a stage-3 step fetches its parameters without a
// cudaMalloc once the first step has made the buffers. Cached buffers are released when a
// cudaMalloc finds the device full, and when the accelerator is destroyed.
//
// Thread safety: as Accelerator. Every call sets the accelerator's device on the calling
// thread first.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "offload/accelerator.h"

namespace zinf::offload {

// Devices the CUDA runtime reports; 0 when there is none, the runtime fails to start, or
// zinf was built without CUDA. Never throws.
[[nodiscard]] int cuda_device_count() noexcept;

// Why no CUDA device can be used (for test skips and error messages); empty when one can.
[[nodiscard]] std::string cuda_unavailable_reason();

class CudaAccelerator final : public Accelerator {
 public:
  // Throws OffloadError(kDevice) when CUDA support is not built, no device exists or
  // `device` is out of range. `memory_budget_bytes` 0 means the device's total memory.
  explicit CudaAccelerator(int device = 0, uint64_t memory_budget_bytes = 0);
  ~CudaAccelerator() override;

  std::string_view name() const noexcept override { return "cuda"; }
  int device() const noexcept { return device_; }
  // cudaMalloc calls so far, and the bytes held in the free list now.
  uint64_t runtime_allocations() const noexcept;
  uint64_t cached_bytes() const noexcept;

  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                      Stream& stream) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes, Stream& stream) override;
  void copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                      Stream& stream) override;
  void fill_zero(void* device_dst, size_t bytes, Stream& stream) override;
  ComputeView compute_view(void* device_ptr, size_t bytes) override;
  ComputeView compute_device() const noexcept override {
    return {nullptr, ComputeDevice::kCuda, device_};
  }
  bool host_reads_device_memory() const noexcept override { return false; }
  void launch_host_func(Stream& stream, std::function<void()> fn) override;
  void record_event(Event& event, Stream& stream) override;
  void wait_event(Stream& stream, Event& event) override;

  void register_host(void* ptr, size_t bytes) override;
  void unregister_host(void* ptr, size_t bytes) noexcept override;
  uint64_t registered_host_bytes() const noexcept override;
  aio::PinHooks pin_hooks() override;

 protected:
  void* device_malloc(size_t bytes, std::string_view what) override;
  void device_free(void* ptr, size_t bytes) noexcept override;

 private:
  const int device_;
  mutable std::mutex mutex_;
  std::map<void*, size_t> registered_;  // guarded by mutex_: ranges this object registered
  uint64_t registered_bytes_ = 0;       // guarded by mutex_

  void release_cache() noexcept;  // with mutex_ held
  struct Cached {
    void* ptr = nullptr;
    void* freed = nullptr;  // cudaEvent_t recorded on the default stream at free
  };
  std::multimap<size_t, Cached> cache_;  // guarded by mutex_: free buffers by size
  uint64_t cached_bytes_ = 0;            // guarded by mutex_
  uint64_t runtime_allocations_ = 0;     // guarded by mutex_
};

}  // namespace zinf::offload
