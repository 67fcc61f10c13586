// The strict communicator over the single communicator: collectives run on strict device
// memory (through its aliases) and refuse host memory, naming the collective and the buffer,
// as NCCL would on a GPU.
#include "zero/comm/strict_communicator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "offload/strict_accelerator.h"
#include "zero/comm/single_communicator.h"

namespace zinf::zero {
namespace {

std::unique_ptr<Communicator> strict_single() {
  DeviceMemoryMap map;
  map.alias = [](const void* ptr, size_t bytes) { return offload::strict_alias(ptr, bytes); };
  map.describe = [](const void* ptr) { return offload::describe_strict_pointer(ptr); };
  return make_strict_communicator(std::make_unique<SingleCommunicator>(), std::move(map));
}

TEST(StrictCommunicator, CollectivesRunOnDeviceMemory) {
  offload::StrictAccelerator acc(1 << 20);
  auto stream = acc.create_stream();
  auto comm = strict_single();
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  offload::DeviceBuffer send = acc.allocate(values.size() * sizeof(float), "send");
  offload::DeviceBuffer recv = acc.allocate(values.size() * sizeof(float), "recv");
  acc.copy_to_device(send.data(), values.data(), send.size(), *stream);
  stream->synchronize();
  comm->all_gather(send.data(), recv.data(), values.size(), DType::kFloat32)->wait();
  comm->all_reduce(recv.data(), values.size(), DType::kFloat32, ReduceOp::kSum)->wait();
  comm->broadcast(recv.data(), values.size(), DType::kFloat32, 0)->wait();
  std::vector<float> back(values.size());
  acc.copy_to_host(back.data(), recv.data(), recv.size(), *stream);
  stream->synchronize();
  EXPECT_EQ(back, values);
}

TEST(StrictCommunicator, HostMemoryIsRefusedNamingTheCollectiveAndTheBuffer) {
  offload::StrictAccelerator acc(1 << 20);
  auto comm = strict_single();
  int64_t flag = 1;
  try {
    comm->all_reduce(&flag, 1, DType::kInt64, ReduceOp::kMax)->wait();
    FAIL() << "a host buffer was reduced";
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "all_reduce");
    const std::string message = e.what();
    EXPECT_NE(message.find("the buffer"), std::string::npos) << message;
    EXPECT_NE(message.find("(8 bytes) is not device memory (host memory)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("NCCL would refuse it"), std::string::npos) << message;
  }
  // A receive buffer too small for the gathered data runs past its allocation.
  offload::DeviceBuffer send = acc.allocate(4096, "send");
  offload::DeviceBuffer recv = acc.allocate(4096, "small recv");
  std::vector<float> host(1024);
  EXPECT_THROW(comm->all_gather(host.data(), recv.data(), 1024, DType::kFloat32), CommError);
  try {
    comm->reduce_scatter(send.data(), static_cast<std::byte*>(recv.data()) + 4000, 100,
                         DType::kFloat32)
        ->wait();
    FAIL() << "a receive range past its allocation was accepted";
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "reduce_scatter");
    EXPECT_NE(std::string(e.what()).find("\"small recv\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf::zero
