// Tensors over device memory: how zero/ hands the accelerator's buffers to LibTorch. The
// tensor is built over the accelerator's compute view of the buffer (offload/accelerator.h)
// on the LibTorch device it names: a CUDA tensor over CUDA memory, a CPU tensor over the
// strict device's read-write alias, a CPU tensor over the CPU accelerator's host memory.
// Host code never reads device memory through anything else.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>

#include "offload/accelerator.h"
#include "zero/comm/communicator.h"

namespace zinf::zero {

// The LibTorch device LibTorch computes on with `accelerator`.
[[nodiscard]] c10::Device compute_device(offload::Accelerator& accelerator);

// A tensor of `shape` and `dtype` over the device memory at `device_ptr` (not owned: it
// must outlive the tensor's use).
[[nodiscard]] at::Tensor device_tensor(offload::Accelerator& accelerator, void* device_ptr,
                                       c10::IntArrayRef shape, DType dtype);

// Makes the accelerator's streams see what LibTorch's current stream has written so far on
// `device` (no-op on the CPU, where LibTorch's work is done when its call returns).
void wait_for_compute(const c10::Device& device);

// The DType of a LibTorch scalar type; ZeroError for types zinf does not handle.
[[nodiscard]] DType dtype_of(c10::ScalarType type);

}  // namespace zinf::zero
