// SingleCommunicator: world of one; collectives complete at once and copy where the layout
// says so; bad arguments fail as on every backend; the factory picks it for a world of one.
#include "zero/comm/single_communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/common/seed.h"
#include "zero/comm/make_communicator.h"

namespace zinf::zero {
namespace {

TEST(SingleCommunicator, CollectivesCompleteAndCopy) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  SingleCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.backend(), "single");

  const size_t count = 1 + rng() % 1000;
  std::vector<float> send(count);
  for (float& v : send) {
    v = std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  std::vector<float> recv(count, 0.0f);
  WorkPtr work = comm.all_gather(send.data(), recv.data(), count, DType::kFloat32);
  EXPECT_TRUE(work->completed());
  work->wait();
  EXPECT_EQ(recv, send);

  std::vector<float> scattered(count, 0.0f);
  comm.reduce_scatter(send.data(), scattered.data(), count, DType::kFloat32)->wait();
  EXPECT_EQ(scattered, send);

  std::vector<float> data = send;
  comm.all_reduce(data.data(), count, DType::kFloat32, ReduceOp::kMax)->wait();
  EXPECT_EQ(data, send);
  comm.broadcast(data.data(), count, DType::kFloat32, 0)->wait();
  EXPECT_EQ(data, send);
  comm.barrier()->wait();

  // In place all_gather leaves the data alone.
  std::vector<int64_t> ints{1, -2, 3};
  comm.all_gather(ints.data(), ints.data(), ints.size(), DType::kInt64)->wait();
  EXPECT_EQ(ints, (std::vector<int64_t>{1, -2, 3}));
}

TEST(SingleCommunicator, RejectsBadArguments) {
  SingleCommunicator comm;
  std::vector<float> buffer(8);
  EXPECT_THROW(static_cast<void>(comm.all_gather(nullptr, buffer.data(), 4, DType::kFloat32)),
               CommError);
  // Overlapping, but not this rank's slice.
  EXPECT_THROW(
      static_cast<void>(comm.all_gather(buffer.data() + 1, buffer.data(), 4, DType::kFloat32)),
      CommError);
  EXPECT_THROW(
      static_cast<void>(comm.reduce_scatter(buffer.data(), buffer.data() + 2, 4, DType::kFloat32)),
      CommError);
  try {
    static_cast<void>(comm.broadcast(buffer.data(), 4, DType::kFloat32, 1));
    ADD_FAILURE() << "root 1 accepted in a world of one";
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "broadcast");
    EXPECT_NE(std::string(e.what()).find("root 1"), std::string::npos) << e.what();
  }
  // Zero elements with null buffers are fine.
  comm.all_reduce(nullptr, 0, DType::kBFloat16)->wait();
}

TEST(MakeCommunicator, PicksSingleForAWorldOfOne) {
  LaunchEnv env;
  env.launcher = "none";
  std::unique_ptr<Communicator> comm = make_communicator(env, CommOptions{});
  EXPECT_EQ(comm->backend(), "single");
  EXPECT_EQ(comm->timeout(), std::chrono::milliseconds(300'000));
}

TEST(MakeCommunicator, RejectsUnknownBackendAndSingleForManyRanks) {
  LaunchEnv env;
  CommOptions options;
  options.backend = "mpi";
  try {
    static_cast<void>(make_communicator(env, options));
    ADD_FAILURE() << "backend mpi accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("\"mpi\""), std::string::npos) << e.what();
  }
  env.world_size = 2;
  env.rank = 1;
  options.backend = "single";
  EXPECT_THROW(static_cast<void>(make_communicator(env, options)), CommError);
}

TEST(DTypes, NamesAndSizes) {
  EXPECT_EQ(to_string(DType::kFloat32), "fp32");
  EXPECT_EQ(to_string(DType::kBFloat16), "bf16");
  EXPECT_EQ(to_string(DType::kFloat16), "fp16");
  EXPECT_EQ(to_string(DType::kFloat64), "fp64");
  EXPECT_EQ(to_string(DType::kInt64), "int64");
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(to_string(ReduceOp::kSum), "sum");
  EXPECT_EQ(to_string(ReduceOp::kMax), "max");
  const CommError error("all_gather", 3, "boom");
  EXPECT_STREQ(error.what(), "zinf comm: all_gather on rank 3: boom");
}

}  // namespace
}  // namespace zinf::zero
