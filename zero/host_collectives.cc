#include "zero/host_collectives.h"

#include <cstdint>

namespace zinf::zero {
namespace {

// A device buffer of `bytes` holding a copy of `host` (when given).
offload::DeviceBuffer staged(offload::Accelerator& accelerator, offload::Stream& stream,
                             const void* host, size_t bytes) {
  offload::DeviceBuffer buffer = accelerator.allocate(bytes, "host collective staging");
  if (host != nullptr) {
    accelerator.copy_to_device(buffer.data(), host, bytes, stream);
    stream.synchronize();
  }
  return buffer;
}

void back(offload::Accelerator& accelerator, offload::Stream& stream, void* host,
          const offload::DeviceBuffer& buffer) {
  accelerator.copy_to_host(host, buffer.data(), buffer.size(), stream);
  stream.synchronize();
}

}  // namespace

void host_all_reduce(Communicator& comm, offload::Accelerator& accelerator, void* data,
                     size_t count, DType dtype, ReduceOp op) {
  if (accelerator.host_reads_device_memory() || count == 0) {
    comm.all_reduce(data, count, dtype, op)->wait();
    return;
  }
  auto stream = accelerator.create_stream();
  offload::DeviceBuffer buffer = staged(accelerator, *stream, data, count * dtype_size(dtype));
  comm.all_reduce(buffer.data(), count, dtype, op)->wait();
  back(accelerator, *stream, data, buffer);
}

void host_all_gather(Communicator& comm, offload::Accelerator& accelerator, const void* send,
                     void* recv, size_t count, DType dtype) {
  if (accelerator.host_reads_device_memory() || count == 0) {
    comm.all_gather(send, recv, count, dtype)->wait();
    return;
  }
  auto stream = accelerator.create_stream();
  const size_t bytes = count * dtype_size(dtype);
  offload::DeviceBuffer in = staged(accelerator, *stream, send, bytes);
  offload::DeviceBuffer out =
      staged(accelerator, *stream, nullptr, bytes * static_cast<size_t>(comm.world_size()));
  comm.all_gather(in.data(), out.data(), count, dtype)->wait();
  back(accelerator, *stream, recv, out);
}

void host_broadcast(Communicator& comm, offload::Accelerator& accelerator, void* data, size_t count,
                    DType dtype, int root) {
  if (accelerator.host_reads_device_memory() || count == 0) {
    comm.broadcast(data, count, dtype, root)->wait();
    return;
  }
  auto stream = accelerator.create_stream();
  offload::DeviceBuffer buffer = staged(accelerator, *stream, data, count * dtype_size(dtype));
  comm.broadcast(buffer.data(), count, dtype, root)->wait();
  back(accelerator, *stream, data, buffer);
}

}  // namespace zinf::zero
