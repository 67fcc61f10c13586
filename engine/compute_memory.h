// Compute memory: what LibTorch itself holds on the device zinf computes on — activations,
// autograd's saved tensors and a layer's recomputation, the loss's chunks, gradients before
// the reducer takes them. zinf's own device memory (parameters, buckets, slices) goes through
// the Accelerator and is counted there (offload/accelerator.h); this is the rest, the part the
// memory plan calls activations.
//
// On the CPU (the cpu and strict accelerators compute there) LibTorch allocates through
// c10's CPU allocator: track_compute_memory() puts a counting allocator in front of it once
// per process, so every CPU tensor LibTorch allocates afterwards is counted while it lives
// (tensors made before are not). On CUDA, LibTorch's caching allocator keeps the figures
// itself; they are read where LibTorch has c10/core/CachingDeviceAllocator.h (torch 2.11 has
// it, 1.13 has not), and reported as not measured otherwise.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace zinf::engine {

struct ComputeMemory {
  bool measured = false;  // false: this LibTorch gives no figures for the device
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;  // since the last reset_compute_peak (or the start)
};

// Installs the counting CPU allocator (idempotent). Call before the model's tensors are made.
void track_compute_memory();

// LibTorch's allocations on `device` now and at their peak.
[[nodiscard]] ComputeMemory compute_memory(const c10::Device& device);

// Starts a new peak on `device` at the bytes in use now.
void reset_compute_peak(const c10::Device& device);

}  // namespace zinf::engine
