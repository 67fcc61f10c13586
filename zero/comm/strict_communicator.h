// The strict communicator: with the strict device (offload/strict_accelerator.h), every
// collective's buffers must be device memory, as NCCL requires on a GPU. It wraps the
// communicator the launch made (Gloo or single), hands it the read-write aliases of the
// device buffers, and refuses a host buffer with a CommError naming the collective, the
// buffer and the rank, before anything is sent.
//
// Thread safety: as the wrapped communicator.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "zero/comm/communicator.h"

namespace zinf::zero {

struct DeviceMemoryMap {
  // The host-usable alias of [ptr, ptr + bytes) when it is device memory; nullptr otherwise.
  std::function<void*(const void* ptr, size_t bytes)> alias;
  // Words for an error message about `ptr` (which allocation); may be empty.
  std::function<std::string(const void* ptr)> describe;
};

// `inner`: the communicator collectives really run on; it must not be null.
[[nodiscard]] std::unique_ptr<Communicator> make_strict_communicator(
    std::unique_ptr<Communicator> inner, DeviceMemoryMap map);

}  // namespace zinf::zero
