// Collectives on host memory — a loss, a flag, the gradient norm's partial sums, introspection —
// that wait for their result. Where the accelerator's device memory is host memory (the CPU
// accelerator) the communicator works on the caller's buffers; elsewhere (CUDA with NCCL, the
// strict device) the data goes through a device buffer of the accelerator: copied in, reduced
// there, copied back. Every rank must make the same calls in the same order, as for the
// communicator itself.
//
// Thread safety: as the communicator's.
#pragma once

#include <cstddef>

#include "offload/accelerator.h"
#include "zero/comm/communicator.h"

namespace zinf::zero {

void host_all_reduce(Communicator& comm, offload::Accelerator& accelerator, void* data,
                     size_t count, DType dtype, ReduceOp op);
// recv holds world size x count elements.
void host_all_gather(Communicator& comm, offload::Accelerator& accelerator, const void* send,
                     void* recv, size_t count, DType dtype);
void host_broadcast(Communicator& comm, offload::Accelerator& accelerator, void* data, size_t count,
                    DType dtype, int root);

}  // namespace zinf::zero
