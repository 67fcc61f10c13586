// GlooCommunicator on loopback: every test here launches 2 or 3 ranks of this executable
// (tests/common/multi_process.h); each rank runs one DISABLED_ GlooRank case and the
// launching test checks their exit status and output.
//   - every collective and dtype against a reference computed locally (odd counts, in-place
//     all_gather, several collectives in flight), with the ring and the c10d algorithms;
//   - a rank killed midway: the others fail within the timeout, naming the collective and
//     the dead rank, and the broken communicator refuses later calls at once;
//   - a rank that never arrives: the rendezvous fails naming it.
// GlooBench.DISABLED_* time the algorithms (run by hand, never asserted):
//   comm_gloo_test --gtest_also_run_disabled_tests --gtest_filter='GlooBench.*'
#include "zero/comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/comm/collective_check.h"
#include "tests/common/multi_process.h"
#include "tests/common/seed.h"
#include "zero/comm/launch_env.h"
#include "zero/comm/make_communicator.h"

namespace zinf::zero {
namespace {

using Clock = std::chrono::steady_clock;
using comm_test::CollectiveRound;
using comm_test::env_or;
using comm_test::expect_comm_error;

// ---------------------------------------------------------------------------------------------
// Helpers shared by the ranks

CommOptions rank_options() {
  CommOptions options;
  options.backend = env_or("ZINF_TEST_BACKEND", "gloo");
  // ZINF_TEST_TIMEOUT_MS_RANK<r> gives one rank its own timeout.
  const std::string timeout_ms = env_or("ZINF_TEST_TIMEOUT_MS", "20000");
  options.timeout = std::chrono::milliseconds(
      std::stoll(env_or(("ZINF_TEST_TIMEOUT_MS_RANK" + env_or("RANK", "0")).c_str(), timeout_ms)));
  const std::string algo = env_or("ZINF_TEST_ALGO", "ring");
  options.gloo_reduce_scatter =
      algo == "ring" ? GlooReduceScatter::kRing : GlooReduceScatter::kAllReduce;
  options.gloo_all_gather = algo == "ring" ? GlooAllGather::kRing : GlooAllGather::kC10d;
  return options;
}

std::unique_ptr<Communicator> make_rank_communicator() {
  return make_communicator(detect_launch_env(), rank_options());
}

// ---------------------------------------------------------------------------------------------
// Rank bodies (run only inside ranks started by run_ranks)

TEST(GlooRank, DISABLED_Collectives) {
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::unique_ptr<Communicator> comm = make_rank_communicator();
  const int rank = comm->rank();
  const int world = comm->world_size();
  EXPECT_EQ(comm->backend(), "gloo");
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                          DType::kInt64};
  const size_t counts[] = {1, 7, 1001, 65537};
  uint64_t salt = 0;
  for (DType dtype : dtypes) {
    for (size_t count : counts) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " count " + std::to_string(count));
      salt += 8;
      CollectiveRound round(seed, salt, rank, world, dtype, count);

      // Several collectives in flight at once, waited for at the end.
      std::vector<WorkPtr> works;
      works.push_back(
          comm->all_gather(round.gather_send.data(), round.gather_recv.data(), count, dtype));
      works.push_back(comm->all_gather(round.in_place_send(round.in_place.data()),
                                       round.in_place.data(), count, dtype));
      works.push_back(
          comm->reduce_scatter(round.scatter_send.data(), round.scatter_sum.data(), count, dtype));
      works.push_back(comm->reduce_scatter(round.scatter_send.data(), round.scatter_max.data(),
                                           count, dtype, ReduceOp::kMax));
      works.push_back(comm->all_reduce(round.reduce_sum.data(), count, dtype));
      works.push_back(comm->all_reduce(round.reduce_max.data(), count, dtype, ReduceOp::kMax));
      works.push_back(comm->broadcast(round.bcast.data(), count, dtype, world - 1));
      works.push_back(comm->barrier());
      for (WorkPtr& work : works) {
        work->wait();
        EXPECT_TRUE(work->completed());
      }
      round.expect_results();
    }
  }
  // Zero elements: completes, nothing touched.
  comm->all_reduce(nullptr, 0, DType::kFloat32)->wait();
  comm->barrier()->wait();
}

TEST(GlooRank, DISABLED_KilledRank) {
  std::unique_ptr<Communicator> comm = make_rank_communicator();
  const int victim = std::stoi(env_or("ZINF_TEST_VICTIM", "1"));
  const std::string op = env_or("ZINF_TEST_OP", "all_reduce");
  const size_t count = 100003;
  std::vector<float> data(count * static_cast<size_t>(comm->world_size()), 1.0f);
  std::vector<float> out(count);
  auto collective = [&] {
    if (op == "reduce_scatter") {
      comm->reduce_scatter(data.data(), out.data(), count, DType::kFloat32)->wait();
    } else {
      comm->all_reduce(data.data(), count, DType::kFloat32)->wait();
    }
  };
  collective();  // everyone is alive for the first one
  if (comm->rank() == victim) {
    ::raise(SIGKILL);
  }
  expect_comm_error(*comm, [&] {
    for (int i = 0; i < 1000; ++i) {
      collective();
    }
  });
}

TEST(GlooRank, DISABLED_Rendezvous) {
  try {
    std::unique_ptr<Communicator> comm = make_rank_communicator();
    ADD_FAILURE() << "rendezvous succeeded";
  } catch (const CommError& e) {
    std::cout << "COMM_ERROR[" << e.what() << "]" << std::endl;
    FAIL() << e.what();
  }
}

// Median milliseconds per call of `run` over `reps` calls (after one warm-up).
template <typename Run>
double median_ms(Communicator& comm, int reps, Run run) {
  std::vector<double> ms;
  run();
  for (int i = 0; i < reps; ++i) {
    comm.barrier()->wait();
    const Clock::time_point start = Clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

TEST(GlooRank, DISABLED_Bench) {
  const LaunchEnv env = detect_launch_env();
  CommOptions ring_options = rank_options();
  ring_options.gloo_reduce_scatter = GlooReduceScatter::kRing;
  ring_options.gloo_all_gather = GlooAllGather::kRing;
  CommOptions c10d_options = ring_options;
  c10d_options.gloo_reduce_scatter = GlooReduceScatter::kAllReduce;
  c10d_options.gloo_all_gather = GlooAllGather::kC10d;
  std::unique_ptr<Communicator> ring = make_communicator(env, ring_options);
  std::unique_ptr<Communicator> c10d = make_communicator(env, c10d_options);
  const int world = ring->world_size();
  const int reps = std::stoi(env_or("ZINF_BENCH_REPS", "5"));
  for (size_t count : {size_t{1} << 12, size_t{1} << 16, size_t{1} << 20, size_t{1} << 22}) {
    std::vector<float> send(count * static_cast<size_t>(world), 1.0f);
    std::vector<float> recv(count);
    std::vector<float> gathered(count * static_cast<size_t>(world));
    const double rs_ring = median_ms(*ring, reps, [&] {
      ring->reduce_scatter(send.data(), recv.data(), count, DType::kFloat32)->wait();
    });
    const double rs_allreduce = median_ms(*c10d, reps, [&] {
      c10d->reduce_scatter(send.data(), recv.data(), count, DType::kFloat32)->wait();
    });
    const double ag_ring = median_ms(*ring, reps, [&] {
      ring->all_gather(recv.data(), gathered.data(), count, DType::kFloat32)->wait();
    });
    const double ag_c10d = median_ms(*c10d, reps, [&] {
      c10d->all_gather(recv.data(), gathered.data(), count, DType::kFloat32)->wait();
    });
    if (ring->rank() == 0) {
      std::cout << "BENCH world " << world << " count/rank " << count
                << " fp32: reduce_scatter ring " << rs_ring << " ms, all_reduce+slice "
                << rs_allreduce << " ms (ratio " << rs_allreduce / rs_ring << "); all_gather ring "
                << ag_ring << " ms, c10d " << ag_c10d << " ms (ratio " << ag_c10d / ag_ring << ")"
                << std::endl;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launching tests

void run_collectives(int world, const std::string& backend, const std::string& algo) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  testing::RanksOptions o;
  o.world_size = world;
  o.test = "GlooRank.DISABLED_Collectives";
  o.deadline = std::chrono::seconds(90);
  o.env = {{"ZINF_TEST_SEED", std::to_string(seed)},
           {"ZINF_TEST_BACKEND", backend},
           {"ZINF_TEST_ALGO", algo}};
  testing::expect_ranks_passed(testing::run_ranks(o));
}

TEST(GlooCommunicator, CollectivesTwoRanksRing) { run_collectives(2, "gloo", "ring"); }
TEST(GlooCommunicator, CollectivesThreeRanksRing) { run_collectives(3, "gloo", "ring"); }
// backend "auto" with a world of three builds the Gloo communicator.
TEST(GlooCommunicator, CollectivesThreeRanksC10dAuto) { run_collectives(3, "auto", "c10d"); }

void run_killed(int world, int victim, const std::string& op) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  constexpr int kTimeoutMs = 3000;
  testing::RanksOptions o;
  o.world_size = world;
  o.test = "GlooRank.DISABLED_KilledRank";
  o.deadline = std::chrono::seconds(40);
  o.env = {{"ZINF_TEST_TIMEOUT_MS", std::to_string(kTimeoutMs)},
           {"ZINF_TEST_VICTIM", std::to_string(victim)},
           {"ZINF_TEST_OP", op}};
  const std::vector<testing::RankResult> results = testing::run_ranks(o);
  for (const testing::RankResult& r : results) {
    SCOPED_TRACE(testing::describe(r));
    if (std::getenv("ZINF_TEST_VERBOSE") != nullptr) {
      std::cout << testing::describe(r);
    }
    if (r.rank == victim) {
      EXPECT_FALSE(r.exited);
      EXPECT_EQ(r.signal, SIGKILL);
      continue;
    }
    EXPECT_TRUE(testing::rank_failed(r));
    EXPECT_NE(r.output.find("COMM_ERROR[zinf comm: " + op + " on rank " + std::to_string(r.rank)),
              std::string::npos);
    // The victim is named; rank 0 serves the store, so its death shows as the store going.
    const std::string named =
        victim == 0 ? "rank 0 has failed" : "rank " + std::to_string(victim) + " stopped";
    EXPECT_NE(r.output.find(named), std::string::npos);
    EXPECT_NE(r.output.find(" ms (timeout 3000 ms)"), std::string::npos);
    EXPECT_NE(r.output.find("BROKEN_AT_ONCE"), std::string::npos);
  }
}

TEST(GlooCommunicator, KilledRankEndsOthersDuringAllReduce) { run_killed(3, 1, "all_reduce"); }
TEST(GlooCommunicator, KilledRankEndsOthersDuringRingReduceScatter) {
  run_killed(3, 2, "reduce_scatter");
}
TEST(GlooCommunicator, KilledStoreHostEndsOthers) { run_killed(2, 0, "all_reduce"); }

void run_missing(int world, const std::vector<int>& started, const std::string& expected,
                 const std::vector<std::pair<std::string, std::string>>& extra_env = {}) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  testing::RanksOptions o;
  o.world_size = world;
  o.ranks = started;
  o.test = "GlooRank.DISABLED_Rendezvous";
  o.deadline = std::chrono::seconds(40);
  o.env = {{"ZINF_TEST_TIMEOUT_MS", "3000"}};
  o.env.insert(o.env.end(), extra_env.begin(), extra_env.end());
  const Clock::time_point start = Clock::now();
  const std::vector<testing::RankResult> results = testing::run_ranks(o);
  for (const testing::RankResult& r : results) {
    SCOPED_TRACE(testing::describe(r));
    if (std::getenv("ZINF_TEST_VERBOSE") != nullptr) {
      std::cout << testing::describe(r);
    }
    EXPECT_TRUE(testing::rank_failed(r));
    EXPECT_NE(r.output.find("COMM_ERROR[zinf comm: rendezvous on rank " + std::to_string(r.rank)),
              std::string::npos);
    EXPECT_NE(r.output.find(expected), std::string::npos);
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
}

TEST(GlooCommunicator, RankThatNeverArrivesIsNamed) {
  run_missing(3, {0, 1}, "rank 2 of 3 did not join within");
}
// Rank 0 gives up long before rank 1 would and its exit takes the store away; rank 1 still
// names the missing rank (rank 0 publishes its finding and serves the store until it is read).
TEST(GlooCommunicator, StoreHostGivingUpFirstStillNamesTheMissingRank) {
  run_missing(3, {0, 1}, "rank 2 of 3 did not join within",
              {{"ZINF_TEST_TIMEOUT_MS_RANK0", "1000"}});
}
TEST(GlooCommunicator, MissingStoreHostIsNamed) {
  run_missing(3, {1, 2}, "rank 0 has not started it");
}

// A store that takes the connection and never answers (as torchrun of torch 2.x does for
// LibTorch 1.13's client): the rendezvous fails naming the store, and does not wait forever.
TEST(GlooCommunicator, AStoreThatNeverAnswersIsNamed) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  // Accepts and reads whatever comes, answers nothing, until the test ends.
  std::atomic<bool> done{false};
  std::thread silent([&] {
    std::vector<int> peers;
    while (!done.load()) {
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (const int p : peers) fds.push_back({p, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if ((fds[0].revents & POLLIN) != 0) {
        const int peer = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (peer >= 0) peers.push_back(peer);
      }
      char sink[4096];
      for (size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & POLLIN) != 0) (void)::read(fds[i].fd, sink, sizeof(sink));
      }
    }
    for (const int p : peers) ::close(p);
  });
  LaunchEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = ntohs(address.sin_port);
  env.agent_store = true;
  env.store_prefix = "/worker/attempt_0";
  env.launcher = "torchrun";
  CommOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  const Clock::time_point start = Clock::now();
  std::string message;
  try {
    (void)make_communicator(env, options);
    ADD_FAILURE() << "the rendezvous with a silent store succeeded";
  } catch (const CommError& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  done = true;
  silent.join();
  ::close(listener);
  EXPECT_NE(message.find("rendezvous on rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(env.master_port)), std::string::npos)
      << message;
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.13's client blocks in the first call that waits for an answer.
  EXPECT_NE(message.find("did not answer a call"), std::string::npos) << message;
#endif
  EXPECT_LT(seconds, 20.0) << message;
  std::cout << "STORE silent store named after " << seconds << " s: " << message << "\n";
}

TEST(GlooBench, DISABLED_Algorithms) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  for (int world : {2, 3}) {
    testing::RanksOptions o;
    o.world_size = world;
    o.test = "GlooRank.DISABLED_Bench";
    o.deadline = std::chrono::seconds(300);
    const std::vector<testing::RankResult> results = testing::run_ranks(o);
    for (const testing::RankResult& r : results) {
      EXPECT_TRUE(testing::rank_passed(r));
      if (r.rank == 0) {
        std::cout << r.output;
      }
    }
  }
}

}  // namespace
}  // namespace zinf::zero
