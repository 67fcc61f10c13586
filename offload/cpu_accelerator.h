// CpuAccelerator: an Accelerator whose "device" is host memory with an enforced budget
// (config `accelerator.memory_budget`), so every path of the offload tier runs on machines
// without a GPU.
//
// Each stream is a long-lived worker thread that runs its work (copies, host functions,
// event records and waits) strictly in enqueue order; different streams run concurrently,
// so copies on two streams really overlap with each other and with the caller. Device
// memory is 64-byte aligned host memory. register_host only counts the registered bytes:
// host memory needs no registration here, and the count lets tests see that pools
// registered their buffers.
//
// StrictAccelerator derives from it, keeping its streams and changing only where device
// memory lives.
//
// Thread safety: as Accelerator. A stream's destructor runs the work still queued on it and
// joins its thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "offload/accelerator.h"

namespace zinf::offload {

class CpuAccelerator : public Accelerator {
 public:
  // `memory_budget_bytes`: the most device memory in use at once.
  explicit CpuAccelerator(uint64_t memory_budget_bytes);
  ~CpuAccelerator() override;

  std::string_view name() const noexcept override { return "cpu"; }

  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                      Stream& stream) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes, Stream& stream) override;
  void copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                      Stream& stream) override;
  void fill_zero(void* device_dst, size_t bytes, Stream& stream) override;
  ComputeView compute_view(void* device_ptr, size_t bytes) override;
  ComputeView compute_device() const noexcept override { return {}; }
  bool host_reads_device_memory() const noexcept override { return true; }
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
  // Shared with pin hooks, which may outlive this object.
  std::shared_ptr<std::atomic<uint64_t>> registered_bytes_;
};

}  // namespace zinf::offload
