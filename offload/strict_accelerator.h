// StrictAccelerator: the CPU accelerator with device memory the host cannot read
// (`zinf.accelerator.type: "strict"`), so that every place that would read or write GPU
// memory from host code fails on machines without a GPU, in tests and in `zinf train`.
//
// Each allocation is one memfd mapped twice. The pointer handed out (DeviceBuffer::data())
// is mapped PROT_NONE: a host load or store through it faults, and the fault handler prints
// one line naming the allocation (its number and `what`), the byte offset and the address,
// then lets the process die of SIGSEGV as it would have. The second mapping, private to this
// file, is read-write: only the accelerator's own copies (copy_to_device, copy_to_host,
// copy_on_device, fill_zero) and the compute views it gives LibTorch use it — the views are
// CPU tensors over that alias, as a CUDA view is a CUDA tensor over device memory.
//
// The copies also check their pointers as CUDA would not: a "device" pointer that is not
// inside one strict allocation, or a "host" pointer that is, throws OffloadError(kUsage)
// naming the copy and the pointer. strict_alias() lets the strict communicator
// (zero/comm/strict_communicator.h) run collectives on device memory and refuse host memory,
// as NCCL does.
//
// What it cannot catch: memory LibTorch allocates itself (activations, autograd's gradients)
// is ordinary host memory, since the views are CPU tensors; a CPU tensor mixed with a view
// computes fine here where CUDA would refuse it.
//
// Allocations are rounded up to whole pages, so a read past the end of one faults too. Each
// takes two of the process's memory maps (vm.max_map_count): meant for tests and small runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "offload/cpu_accelerator.h"

namespace zinf::offload {

class StrictAccelerator final : public CpuAccelerator {
 public:
  // Installs the fault handler (once per process; it chains to the handler it replaced).
  explicit StrictAccelerator(uint64_t memory_budget_bytes);
  ~StrictAccelerator() override;

  std::string_view name() const noexcept override { return "strict"; }

  void copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                      Stream& stream) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes, Stream& stream) override;
  void copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                      Stream& stream) override;
  void fill_zero(void* device_dst, size_t bytes, Stream& stream) override;
  ComputeView compute_view(void* device_ptr, size_t bytes) override;
  bool host_reads_device_memory() const noexcept override { return false; }

 protected:
  void* device_malloc(size_t bytes, std::string_view what) override;
  void device_free(void* ptr, size_t bytes) noexcept override;
};

// The read-write alias of [ptr, ptr + bytes) when that range lies inside one live strict
// allocation; nullptr otherwise (host memory, or a range crossing an allocation's end).
[[nodiscard]] void* strict_alias(const void* ptr, size_t bytes) noexcept;

// "allocation #7 \"gradient bucket\" (65536 bytes), byte 4096" for a pointer inside a strict
// allocation; empty otherwise. For error messages.
[[nodiscard]] std::string describe_strict_pointer(const void* ptr);

}  // namespace zinf::offload
