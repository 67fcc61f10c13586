#include "offload/cuda_accelerator.h"

#include <exception>
#include <string>
#include <utility>

#include "offload/error.h"

#ifdef ZINF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zinf::offload {

#ifdef ZINF_HAVE_CUDA
namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw OffloadError(ErrorKind::kDevice, "cuda: " + what +
                                               " failed: " + cudaGetErrorName(status) + " (" +
                                               cudaGetErrorString(status) + ")");
  }
}

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device) : device_(device) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaStream() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // drain: never free memory the device still reads
    cudaStreamDestroy(stream_);
  }

  void synchronize() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    std::exception_ptr error;
    {
      std::lock_guard lock(mutex_);
      error = std::exchange(host_error_, nullptr);
    }
    if (error) rethrow_host_function_error(error, "cuda stream");
  }

  void note_host_error(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!host_error_) {
      host_error_ = std::move(error);
    }
  }

  cudaStream_t get() const { return stream_; }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::exception_ptr host_error_;  // guarded by mutex_
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override {
    cudaSetDevice(device_);
    cudaEventDestroy(event_);
  }

  bool query() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    check(status, "cudaEventQuery");
    return true;
  }
  void synchronize() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }

  cudaEvent_t get() const { return event_; }

 private:
  const int device_;
  cudaEvent_t event_ = nullptr;
};

CudaStream& as_cuda(Stream& stream) {
  return downcast_or_throw<CudaStream>(stream, "cuda", "stream");
}

CudaEvent& as_cuda(Event& event) { return downcast_or_throw<CudaEvent>(event, "cuda", "event"); }

// What a host function needs once it runs on the CUDA runtime's thread.
struct HostCall {
  std::function<void()> fn;
  CudaStream* stream;
};

void CUDART_CB run_host_call(void* user_data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(user_data));
  try {
    call->fn();
  } catch (...) {
    call->stream->note_host_error(std::current_exception());
  }
}

uint64_t checked_budget(int device, uint64_t memory_budget_bytes) {
  const int count = cuda_device_count();
  if (count == 0) {
    throw OffloadError(ErrorKind::kDevice, "cuda accelerator: " + cuda_unavailable_reason());
  }
  if (device < 0 || device >= count) {
    throw OffloadError(ErrorKind::kDevice, "cuda accelerator: device " + std::to_string(device) +
                                               " out of range (" + std::to_string(count) +
                                               " devices)");
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return memory_budget_bytes == 0 ? total_bytes : memory_budget_bytes;
}

}  // namespace

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount failed: ") +
           cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
  }
  if (count == 0) {
    return "no CUDA device: cudaGetDeviceCount reports 0 devices";
  }
  return {};
}

CudaAccelerator::CudaAccelerator(int device, uint64_t memory_budget_bytes)
    : Accelerator(checked_budget(device, memory_budget_bytes)), device_(device) {}

CudaAccelerator::~CudaAccelerator() {
  std::lock_guard lock(mutex_);
  cudaSetDevice(device_);
  release_cache();
  for (const auto& [ptr, bytes] : registered_) {
    cudaHostUnregister(ptr);
  }
}

uint64_t CudaAccelerator::runtime_allocations() const noexcept {
  std::lock_guard lock(mutex_);
  return runtime_allocations_;
}

uint64_t CudaAccelerator::cached_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return cached_bytes_;
}

void CudaAccelerator::release_cache() noexcept {
  for (auto& [bytes, block] : cache_) {
    auto event = static_cast<cudaEvent_t>(block.freed);
    cudaEventSynchronize(event);
    cudaEventDestroy(event);
    cudaFree(block.ptr);
  }
  cache_.clear();
  cached_bytes_ = 0;
}

std::unique_ptr<Stream> CudaAccelerator::create_stream() {
  return std::make_unique<CudaStream>(device_);
}

std::unique_ptr<Event> CudaAccelerator::create_event() {
  return std::make_unique<CudaEvent>(device_);
}

void CudaAccelerator::copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                                     Stream& stream) {
  CudaStream& cuda = as_cuda(stream);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, cuda.get()),
        "cudaMemcpyAsync host->device of " + std::to_string(bytes) + " bytes");
}

void CudaAccelerator::copy_to_host(void* host_dst, const void* device_src, size_t bytes,
                                   Stream& stream) {
  CudaStream& cuda = as_cuda(stream);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, cuda.get()),
        "cudaMemcpyAsync device->host of " + std::to_string(bytes) + " bytes");
}

void CudaAccelerator::copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                                     Stream& stream) {
  CudaStream& cuda = as_cuda(stream);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, cuda.get()),
        "cudaMemcpyAsync device->device of " + std::to_string(bytes) + " bytes");
}

void CudaAccelerator::fill_zero(void* device_dst, size_t bytes, Stream& stream) {
  CudaStream& cuda = as_cuda(stream);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemsetAsync(device_dst, 0, bytes, cuda.get()),
        "cudaMemsetAsync of " + std::to_string(bytes) + " bytes");
}

ComputeView CudaAccelerator::compute_view(void* device_ptr, size_t /*bytes*/) {
  return {device_ptr, ComputeDevice::kCuda, device_};
}

void CudaAccelerator::launch_host_func(Stream& stream, std::function<void()> fn) {
  CudaStream& cuda = as_cuda(stream);
  check(cudaSetDevice(device_), "cudaSetDevice");
  auto call = std::make_unique<HostCall>(HostCall{std::move(fn), &cuda});
  check(cudaLaunchHostFunc(cuda.get(), &run_host_call, call.get()), "cudaLaunchHostFunc");
  call.release();  // owned by run_host_call from here on
}

void CudaAccelerator::record_event(Event& event, Stream& stream) {
  CudaStream& cuda_stream = as_cuda(stream);
  CudaEvent& cuda_event = as_cuda(event);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaEventRecord(cuda_event.get(), cuda_stream.get()), "cudaEventRecord");
}

void CudaAccelerator::wait_event(Stream& stream, Event& event) {
  CudaStream& cuda_stream = as_cuda(stream);
  CudaEvent& cuda_event = as_cuda(event);
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaStreamWaitEvent(cuda_stream.get(), cuda_event.get(), 0), "cudaStreamWaitEvent");
}

void CudaAccelerator::register_host(void* ptr, size_t bytes) {
  if (bytes == 0) {
    return;
  }
  check(cudaSetDevice(device_), "cudaSetDevice");
  const cudaError_t status = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (status == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();  // registered by someone else (the pin hooks): usable as it is
    return;
  }
  check(status, "cudaHostRegister of " + std::to_string(bytes) + " bytes");
  std::lock_guard lock(mutex_);
  registered_.emplace(ptr, bytes);
  registered_bytes_ += bytes;
}

void CudaAccelerator::unregister_host(void* ptr, size_t /*bytes*/) noexcept {
  std::lock_guard lock(mutex_);
  const auto it = registered_.find(ptr);
  if (it == registered_.end()) {
    return;  // not registered by this object
  }
  cudaSetDevice(device_);
  cudaHostUnregister(ptr);
  registered_bytes_ -= it->second;
  registered_.erase(it);
}

uint64_t CudaAccelerator::registered_host_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return registered_bytes_;
}

aio::PinHooks CudaAccelerator::pin_hooks() {
  aio::PinHooks hooks;
  hooks.on_pin = [device = device_](void* ptr, size_t bytes) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault),
          "cudaHostRegister of " + std::to_string(bytes) + " bytes");
  };
  hooks.on_unpin = [device = device_](void* ptr, size_t) {
    cudaSetDevice(device);
    if (cudaHostUnregister(ptr) != cudaSuccess) {
      cudaGetLastError();
    }
  };
  return hooks;
}

void* CudaAccelerator::device_malloc(size_t bytes, std::string_view what) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  std::lock_guard lock(mutex_);
  if (auto it = cache_.find(bytes); it != cache_.end()) {
    const Cached block = it->second;
    cache_.erase(it);
    cached_bytes_ -= bytes;
    auto event = static_cast<cudaEvent_t>(block.freed);
    const cudaError_t waited = cudaEventSynchronize(event);  // readers queued before the free
    cudaEventDestroy(event);
    check(waited, "waiting for the last use of a cached device buffer");
    return block.ptr;
  }
  void* data = nullptr;
  cudaError_t status = cudaMalloc(&data, bytes);
  if (status == cudaErrorMemoryAllocation && !cache_.empty()) {
    cudaGetLastError();
    release_cache();
    status = cudaMalloc(&data, bytes);
  }
  check(status, "cudaMalloc of " + std::to_string(bytes) + " bytes" +
                    (what.empty() ? std::string() : " for " + std::string(what)));
  ++runtime_allocations_;
  return data;
}

void CudaAccelerator::device_free(void* ptr, size_t bytes) noexcept {
  cudaSetDevice(device_);
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(event, cudaStreamLegacy) != cudaSuccess) {
    cudaGetLastError();
    if (event != nullptr) cudaEventDestroy(event);
    cudaFree(ptr);  // synchronizes with the device: nothing can still read it
    return;
  }
  std::lock_guard lock(mutex_);
  cache_.emplace(bytes, Cached{ptr, event});
  cached_bytes_ += bytes;
}

#else  // !ZINF_HAVE_CUDA: the type exists, but cannot be constructed.

namespace {
uint64_t no_cuda() {
  throw OffloadError(ErrorKind::kDevice, "cuda accelerator: " + cuda_unavailable_reason());
}
}  // namespace

int cuda_device_count() noexcept { return 0; }

std::string cuda_unavailable_reason() {
  return "zinf was built without CUDA support (no CUDA toolkit found at configure time)";
}

CudaAccelerator::CudaAccelerator(int device, uint64_t /*memory_budget_bytes*/)
    : Accelerator(no_cuda()), device_(device) {}
CudaAccelerator::~CudaAccelerator() = default;
std::unique_ptr<Stream> CudaAccelerator::create_stream() { return nullptr; }
std::unique_ptr<Event> CudaAccelerator::create_event() { return nullptr; }
void CudaAccelerator::copy_to_device(void*, const void*, size_t, Stream&) {}
void CudaAccelerator::copy_to_host(void*, const void*, size_t, Stream&) {}
void CudaAccelerator::copy_on_device(void*, const void*, size_t, Stream&) {}
void CudaAccelerator::fill_zero(void*, size_t, Stream&) {}
ComputeView CudaAccelerator::compute_view(void* device_ptr, size_t) {
  return {device_ptr, ComputeDevice::kCuda, device_};
}
void CudaAccelerator::launch_host_func(Stream&, std::function<void()>) {}
void CudaAccelerator::record_event(Event&, Stream&) {}
void CudaAccelerator::wait_event(Stream&, Event&) {}
void CudaAccelerator::register_host(void*, size_t) {}
void CudaAccelerator::unregister_host(void*, size_t) noexcept {}
uint64_t CudaAccelerator::registered_host_bytes() const noexcept { return 0; }
aio::PinHooks CudaAccelerator::pin_hooks() { return {}; }
void* CudaAccelerator::device_malloc(size_t, std::string_view) { return nullptr; }
uint64_t CudaAccelerator::runtime_allocations() const noexcept { return 0; }
uint64_t CudaAccelerator::cached_bytes() const noexcept { return 0; }
void CudaAccelerator::release_cache() noexcept {}
void CudaAccelerator::device_free(void*, size_t) noexcept {}

#endif

}  // namespace zinf::offload
