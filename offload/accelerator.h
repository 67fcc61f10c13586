// Accelerator: the device as the offload tier sees it — memory tracked against a budget,
// in-order streams, events, asynchronous host<->device copies and host-memory pinning.
//
// Three implementations: CpuAccelerator (offload/cpu_accelerator.h), where the "device" is
// host memory with an enforced budget and every stream is a worker thread that runs its
// work in order, so prefetch and overlap logic really runs concurrently on machines without
// a GPU; StrictAccelerator (offload/strict_accelerator.h), the CPU accelerator with device
// memory the host cannot read, so code that would read GPU memory from the host fails on
// machines without one; and CudaAccelerator (offload/cuda_accelerator.h), on CUDA runtime
// streams and events, built when the CUDA toolkit is present.
//
// Device discipline: a pointer into device memory (DeviceBuffer::data() and offsets into it)
// is touched only by this interface — the copies, fill_zero, and the compute view it gives
// LibTorch. Host code never dereferences it: on a GPU it is not host memory.
//
// Semantics follow CUDA's: work enqueued on one stream runs in order; work on different
// streams may overlap; record_event() marks a point in a stream, and an event completes
// when the stream reaches it (an event never recorded counts as complete); wait_event()
// makes later work on a stream wait for that point. Buffers handed to async copies must stay
// valid until the copy has completed (synchronize the stream or an event recorded after it).
//
// Thread safety: every method of Accelerator may be called from any thread. A Stream or
// Event may be used from several threads; destroying one while another thread uses it is
// the caller's error. Streams and events must be used with the accelerator that made them
// (anything else throws OffloadError(kUsage)), and must not outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "aio/pinned_buffer.h"
#include "offload/error.h"

namespace zinf::offload {

class Accelerator;

// One device allocation. Returns its bytes to the accelerator's budget when destroyed;
// must not outlive the accelerator. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }  // bytes

 private:
  friend class Accelerator;
  DeviceBuffer(Accelerator* owner, void* data, size_t size) noexcept
      : owner_(owner), data_(data), size_(size) {}
  void reset() noexcept;

  Accelerator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// An in-order queue of device work. Work is enqueued through the Accelerator.
class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Blocks until all work enqueued so far has run. If any of it failed (a host function
  // threw, a CUDA error), throws the first failure as OffloadError once.
  virtual void synchronize() = 0;

 protected:
  Stream() = default;
};

// A point in a stream (see record_event). Reusable: each record moves the point.
class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // True when the most recently recorded point has been reached (or nothing was recorded).
  [[nodiscard]] virtual bool query() = 0;
  // Blocks until query() would return true.
  virtual void synchronize() = 0;

 protected:
  Event() = default;
};

// Where LibTorch computes on a range of device memory: the address to build a tensor over and
// the LibTorch device it belongs to.
enum class ComputeDevice : uint8_t { kCpu, kCuda };
struct ComputeView {
  void* data = nullptr;
  ComputeDevice device = ComputeDevice::kCpu;
  int index = -1;  // the CUDA device ordinal; -1 for the CPU
};

struct AcceleratorMemoryStats {
  uint64_t budget_bytes = 0;  // allocations beyond this fail
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;   // high-water mark of in_use_bytes
  uint64_t allocations = 0;  // successful allocate() calls
};

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  [[nodiscard]] virtual std::string_view name() const noexcept = 0;

  // ---- memory ------------------------------------------------------------------------
  // Allocates `bytes` of device memory (0 is allowed and yields an empty buffer). Throws
  // OffloadError(kBudget) naming the requested, in-use and budget bytes when the
  // allocation would exceed the budget; nothing is allocated then. `what` names the
  // allocation in errors and in the strict device's fault message ("gradient bucket").
  [[nodiscard]] DeviceBuffer allocate(size_t bytes, std::string_view what = {});
  [[nodiscard]] AcceleratorMemoryStats memory_stats() const;

  // ---- streams, events, copies ---------------------------------------------------------
  [[nodiscard]] virtual std::unique_ptr<Stream> create_stream() = 0;
  [[nodiscard]] virtual std::unique_ptr<Event> create_event() = 0;

  // Enqueue a copy of `bytes` bytes on `stream`; returns at once.
  virtual void copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                              Stream& stream) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, size_t bytes,
                            Stream& stream) = 0;
  // Device to device, and zero bytes of device memory; both enqueued on `stream`.
  virtual void copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                              Stream& stream) = 0;
  virtual void fill_zero(void* device_dst, size_t bytes, Stream& stream) = 0;

  // ---- computing on device memory ------------------------------------------------------
  // The address and LibTorch device at which [device_ptr, device_ptr + bytes) is computed
  // on (the tensor view LibTorch gets). Work on the view runs on LibTorch's current stream:
  // order it with the accelerator's streams by synchronizing them (or their events) first.
  // Throws OffloadError(kUsage) when the range is not this accelerator's device memory and
  // the accelerator can tell (strict).
  [[nodiscard]] virtual ComputeView compute_view(void* device_ptr, size_t bytes) = 0;
  // The LibTorch device compute views are on (`data` is null).
  [[nodiscard]] virtual ComputeView compute_device() const noexcept = 0;
  // False where host code must not dereference device memory (CUDA, strict).
  [[nodiscard]] virtual bool host_reads_device_memory() const noexcept = 0;
  // Enqueue `fn` on `stream`: it runs on a runtime thread after the work before it. An
  // exception it throws is reported by the stream's next synchronize().
  virtual void launch_host_func(Stream& stream, std::function<void()> fn) = 0;
  virtual void record_event(Event& event, Stream& stream) = 0;
  // Work enqueued on `stream` after this call waits for `event`'s current point.
  virtual void wait_event(Stream& stream, Event& event) = 0;

  // ---- host pinning --------------------------------------------------------------------
  // Registers host memory with the device runtime so copies from/to it run at full speed
  // (cudaHostRegister). The range must stay allocated until unregister_host. Throws
  // OffloadError(kDevice) on a runtime failure.
  virtual void register_host(void* ptr, size_t bytes) = 0;
  virtual void unregister_host(void* ptr, size_t bytes) noexcept = 0;
  // Bytes currently registered through register_host (and the pin hooks).
  [[nodiscard]] virtual uint64_t registered_host_bytes() const noexcept = 0;
  // Hooks for aio::set_pin_hooks(), so every aio::PinnedBuffer (aio's staging memory
  // included) is registered as it is created. They do not refer to this object and stay
  // valid after it is gone.
  [[nodiscard]] virtual aio::PinHooks pin_hooks() = 0;

 protected:
  explicit Accelerator(uint64_t memory_budget_bytes) : budget_bytes_(memory_budget_bytes) {}

  // Raw device allocation of `bytes` > 0 bytes (`what`: see allocate); throws
  // OffloadError(kDevice) or std::bad_alloc on failure. device_free releases what
  // device_malloc returned.
  virtual void* device_malloc(size_t bytes, std::string_view what) = 0;
  virtual void device_free(void* ptr, size_t bytes) noexcept = 0;

 private:
  friend class DeviceBuffer;
  void release(void* ptr, size_t bytes) noexcept;

  const uint64_t budget_bytes_;
  mutable std::mutex mutex_;
  uint64_t in_use_bytes_ = 0;  // guarded by mutex_
  uint64_t peak_bytes_ = 0;    // guarded by mutex_
  uint64_t allocations_ = 0;   // guarded by mutex_
};

// For implementations: `object` (a Stream or Event) as the concrete type `Concrete` that
// accelerator `accelerator` creates; OffloadError(kUsage) when another accelerator made it.
template <typename Concrete, typename Base>
Concrete& downcast_or_throw(Base& object, std::string_view accelerator, std::string_view what) {
  auto* concrete = dynamic_cast<Concrete*>(&object);
  if (concrete == nullptr) {
    throw OffloadError(ErrorKind::kUsage, std::string(accelerator) + " accelerator: " +
                                              std::string(what) + " was not created by it");
  }
  return *concrete;
}

}  // namespace zinf::offload
