// NcclCommunicator.
//   - NcclFactory.*: make_communicator with backend "nccl" where it cannot run (zinf built
//     without NCCL, or no usable CUDA device) throws a CommError that says why, before any
//     rendezvous. Runs everywhere; with a device, an out-of-range device is the error.
//   - NcclCommunicator.*: need CUDA devices and skip with the reason (the CUDA runtime's
//     error text) without them. Each launches ranks of this executable
//     (tests/common/multi_process.h) running one DISABLED_ NcclRank case on device
//     LOCAL_RANK: 1 rank on one device, 2 ranks when there are 2 devices (every collective
//     and dtype against a reference computed locally, odd counts, in-place all_gather,
//     several collectives in flight), and a killed rank (the other fails within the timeout
//     naming the collective, and its broken communicator refuses later calls at once).
#include "zero/comm/nccl_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/comm/collective_check.h"
#include "tests/common/multi_process.h"
#include "tests/common/seed.h"
#include "zero/comm/launch_env.h"
#include "zero/comm/make_communicator.h"

#ifdef ZINF_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace zinf::zero {
namespace {

// ---------------------------------------------------------------------------------------------
// Runs everywhere

// Throws what make_communicator throws for `options` in a world of `world` ranks whose
// store nobody serves (so a rendezvous, if attempted, could only time out).
CommError nccl_error(CommOptions options, int world) {
  LaunchEnv env;
  env.world_size = world;
  env.rank = world - 1;
  env.local_rank = env.rank;
  env.local_world_size = world;
  if (world > 1) {
    env.master_addr = "127.0.0.1";
    env.master_port = testing::free_port();
    env.launcher = "env";
  }
  options.backend = "nccl";
  try {
    std::unique_ptr<Communicator> comm = make_communicator(env, options);
  } catch (const CommError& e) {
    return e;
  }
  ADD_FAILURE() << "make_communicator(\"nccl\") succeeded";
  return CommError("none", -1, "none");
}

TEST(NcclFactory, UnusableBackendGivesClearErrorBeforeRendezvous) {
  if (testing::is_child_rank()) {
    GTEST_SKIP();
  }
  CommOptions options;
  options.timeout = std::chrono::seconds(30);
  for (int world : {1, 2}) {
    SCOPED_TRACE("world size " + std::to_string(world));
    std::string expected;
    if (!nccl_available()) {
      expected = "zinf was built without NCCL";
      EXPECT_EQ(nccl_unavailable_reason().rfind(expected, 0), 0u) << nccl_unavailable_reason();
      EXPECT_EQ(nccl_device_count(), 0);
    } else if (const std::string reason = nccl_unavailable_reason(); !reason.empty()) {
      // No device here: the error carries the CUDA runtime's own text.
      expected = reason.substr(reason.find("cudaGetDeviceCount"));
      EXPECT_EQ(nccl_device_count(), 0);
    } else {
      options.cuda_device = 4096;
      expected = "CUDA device 4096 does not exist";
    }
    const CommError e = nccl_error(options, world);
    std::cout << "make_communicator(\"nccl\"): " << e.what() << std::endl;
    // Refused before the rendezvous (which could only time out: nobody serves the store).
    EXPECT_EQ(e.op(), "make_communicator") << e.what();
    EXPECT_EQ(e.rank(), world - 1);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << e.what() << "\nexpected to contain: " << expected;
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Rank bodies (need a CUDA device; run only inside ranks started by run_ranks)

#ifdef ZINF_HAVE_NCCL

using comm_test::CollectiveRound;
using comm_test::env_or;
using comm_test::expect_comm_error;
using comm_test::HostBuffer;

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// The copy of a host buffer on the current CUDA device.
class DeviceCopy {
 public:
  explicit DeviceCopy(HostBuffer& host) : host_(host) {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, std::max<size_t>(host_.size_bytes(), 1)), "cudaMalloc");
    device_ = p;
  }
  ~DeviceCopy() { cudaFree(device_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  void* device() { return device_; }
  void upload() {
    cuda_ok(cudaMemcpy(device_, host_.data(), host_.size_bytes(), cudaMemcpyHostToDevice),
            "cudaMemcpy to device");
  }
  void download() {
    cuda_ok(cudaMemcpy(host_.data(), device_, host_.size_bytes(), cudaMemcpyDeviceToHost),
            "cudaMemcpy to host");
  }

 private:
  HostBuffer& host_;
  void* device_ = nullptr;
};

std::unique_ptr<Communicator> make_rank_communicator() {
  CommOptions options;
  options.backend = "nccl";
  options.timeout = std::chrono::milliseconds(std::stoll(env_or("ZINF_TEST_TIMEOUT_MS", "60000")));
  return make_communicator(detect_launch_env(), options);
}

TEST(NcclRank, DISABLED_Collectives) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::unique_ptr<Communicator> comm = make_rank_communicator();
  const int rank = comm->rank();
  const int world = comm->world_size();
  EXPECT_EQ(comm->backend(), "nccl");
  cuda_ok(cudaSetDevice(dynamic_cast<NcclCommunicator&>(*comm).device()), "cudaSetDevice");
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                          DType::kInt64};
  const size_t counts[] = {1, 7, 1001, 65537};
  uint64_t salt = 0;
  for (DType dtype : dtypes) {
    for (size_t count : counts) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " count " + std::to_string(count));
      salt += 8;
      CollectiveRound round(seed, salt, rank, world, dtype, count);
      DeviceCopy gather_send(round.gather_send);
      DeviceCopy gather_recv(round.gather_recv);
      DeviceCopy in_place(round.in_place);
      DeviceCopy scatter_send(round.scatter_send);
      DeviceCopy scatter_sum(round.scatter_sum);
      DeviceCopy scatter_max(round.scatter_max);
      DeviceCopy reduce_sum(round.reduce_sum);
      DeviceCopy reduce_max(round.reduce_max);
      DeviceCopy bcast(round.bcast);
      for (DeviceCopy* b :
           {&gather_send, &in_place, &scatter_send, &reduce_sum, &reduce_max, &bcast}) {
        b->upload();
      }
      // The communicator's stream does not wait for other streams: the data must be on the
      // device before the collectives are issued.
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

      // Several collectives in flight at once, waited for at the end.
      std::vector<WorkPtr> works;
      works.push_back(comm->all_gather(gather_send.device(), gather_recv.device(), count, dtype));
      works.push_back(comm->all_gather(round.in_place_send(in_place.device()), in_place.device(),
                                       count, dtype));
      works.push_back(
          comm->reduce_scatter(scatter_send.device(), scatter_sum.device(), count, dtype));
      works.push_back(comm->reduce_scatter(scatter_send.device(), scatter_max.device(), count,
                                           dtype, ReduceOp::kMax));
      works.push_back(comm->all_reduce(reduce_sum.device(), count, dtype));
      works.push_back(comm->all_reduce(reduce_max.device(), count, dtype, ReduceOp::kMax));
      works.push_back(comm->broadcast(bcast.device(), count, dtype, world - 1));
      works.push_back(comm->barrier());
      for (WorkPtr& work : works) {
        work->wait();
        EXPECT_TRUE(work->completed());
      }
      for (DeviceCopy* b : {&gather_recv, &in_place, &scatter_sum, &scatter_max, &reduce_sum,
                            &reduce_max, &bcast}) {
        b->download();
      }
      round.expect_results();
    }
  }
  // Zero elements: completes, nothing touched. Bad arguments fail at once and leave the
  // communicator usable.
  comm->all_reduce(nullptr, 0, DType::kFloat32)->wait();
  EXPECT_THROW(static_cast<void>(comm->broadcast(nullptr, 4, DType::kFloat32, 0)), CommError);
  EXPECT_THROW(static_cast<void>(comm->broadcast(nullptr, 0, DType::kFloat32, world)), CommError);
  comm->barrier()->wait();
}

TEST(NcclRank, DISABLED_KilledRank) {
  std::unique_ptr<Communicator> comm = make_rank_communicator();
  cuda_ok(cudaSetDevice(dynamic_cast<NcclCommunicator&>(*comm).device()), "cudaSetDevice");
  const size_t count = 100003;
  HostBuffer ones(DType::kFloat32, count);
  for (size_t i = 0; i < count; ++i) {
    ones.set(i, 1);
  }
  DeviceCopy data(ones);
  data.upload();
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  comm->all_reduce(data.device(), count, DType::kFloat32)->wait();  // everyone is alive
  if (comm->rank() == 1) {
    ::raise(SIGKILL);
  }
  expect_comm_error(*comm, [&] {
    for (int i = 0; i < 1000; ++i) {
      comm->all_reduce(data.device(), count, DType::kFloat32)->wait();
    }
  });
}

#endif  // ZINF_HAVE_NCCL

// ---------------------------------------------------------------------------------------------
// Launching tests (skip without CUDA devices)

// Skips the calling test unless `devices` CUDA devices can run NCCL here.
#define ZINF_NEED_NCCL_DEVICES(devices)                                                        \
  do {                                                                                         \
    if (testing::is_child_rank()) {                                                            \
      GTEST_SKIP();                                                                            \
    }                                                                                          \
    if (const std::string reason = nccl_unavailable_reason(); !reason.empty()) {               \
      GTEST_SKIP() << reason;                                                                  \
    }                                                                                          \
    if (nccl_device_count() < (devices)) {                                                     \
      GTEST_SKIP() << "needs " << (devices) << " CUDA devices, found " << nccl_device_count(); \
    }                                                                                          \
  } while (false)

TEST(NcclCommunicator, OneRankCollectives) {
  ZINF_NEED_NCCL_DEVICES(1);
  testing::RanksOptions o;
  o.world_size = 1;
  o.test = "NcclRank.DISABLED_Collectives";
  o.deadline = std::chrono::seconds(120);
  testing::expect_ranks_passed(testing::run_ranks(o));
}

TEST(NcclCommunicator, TwoRankCollectives) {
  ZINF_NEED_NCCL_DEVICES(2);
  testing::RanksOptions o;
  o.world_size = 2;
  o.test = "NcclRank.DISABLED_Collectives";
  o.deadline = std::chrono::seconds(120);
  testing::expect_ranks_passed(testing::run_ranks(o));
}

TEST(NcclCommunicator, KilledRankEndsTheOtherWithinTheTimeout) {
  ZINF_NEED_NCCL_DEVICES(2);
  testing::RanksOptions o;
  o.world_size = 2;
  o.test = "NcclRank.DISABLED_KilledRank";
  o.deadline = std::chrono::seconds(60);
  o.env = {{"ZINF_TEST_TIMEOUT_MS", "3000"}};
  const std::vector<testing::RankResult> results = testing::run_ranks(o);
  ASSERT_EQ(results.size(), 2u);
  const testing::RankResult& victim = results[1];
  EXPECT_FALSE(victim.exited) << testing::describe(victim);
  EXPECT_EQ(victim.signal, SIGKILL) << testing::describe(victim);
  const testing::RankResult& survivor = results[0];
  EXPECT_TRUE(testing::rank_failed(survivor));
  EXPECT_NE(survivor.output.find("COMM_ERROR[zinf comm: all_reduce on rank 0"), std::string::npos)
      << testing::describe(survivor);
  EXPECT_NE(survivor.output.find("aborted"), std::string::npos) << testing::describe(survivor);
  EXPECT_NE(survivor.output.find("BROKEN_AT_ONCE"), std::string::npos)
      << testing::describe(survivor);
}

}  // namespace
}  // namespace zinf::zero
