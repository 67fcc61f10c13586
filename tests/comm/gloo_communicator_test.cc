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

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/multi_process.h"
#include "tests/common/seed.h"
#include "zero/comm/launch_env.h"
#include "zero/comm/make_communicator.h"

namespace zinf::zero {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Helpers shared by the ranks

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

CommOptions rank_options() {
  CommOptions options;
  options.backend = env_or("ZINF_TEST_BACKEND", "gloo");
  options.timeout = std::chrono::milliseconds(std::stoll(env_or("ZINF_TEST_TIMEOUT_MS", "20000")));
  const std::string algo = env_or("ZINF_TEST_ALGO", "ring");
  options.gloo_reduce_scatter =
      algo == "ring" ? GlooReduceScatter::kRing : GlooReduceScatter::kAllReduce;
  options.gloo_all_gather = algo == "ring" ? GlooAllGather::kRing : GlooAllGather::kC10d;
  return options;
}

// A small integer in [-8, 8] for (rank, index, salt): sums over 3 ranks stay exact in every
// dtype, so results compare exactly.
int64_t small_value(uint64_t seed, int rank, size_t index, uint64_t salt) {
  uint64_t x = seed ^ (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull) ^ (salt << 32);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<int64_t>(x % 17) - 8;
}

// A typed flat buffer holding small integers.
class Buffer {
 public:
  Buffer(DType dtype, size_t count) : dtype_(dtype), bytes_(count * dtype_size(dtype)) {}

  void* data() { return bytes_.data(); }
  size_t count() const { return bytes_.size() / dtype_size(dtype_); }

  void set(size_t i, int64_t v) {
    unsigned char* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, sizeof(f));
        break;
      }
      case DType::kFloat64: {
        const double d = static_cast<double>(v);
        std::memcpy(p, &d, sizeof(d));
        break;
      }
      case DType::kInt64:
        std::memcpy(p, &v, sizeof(v));
        break;
      case DType::kBFloat16: {
        const c10::BFloat16 b(static_cast<float>(v));
        std::memcpy(p, &b, sizeof(b));
        break;
      }
      case DType::kFloat16: {
        const c10::Half h(static_cast<float>(v));
        std::memcpy(p, &h, sizeof(h));
        break;
      }
    }
  }

  double get(size_t i) const {
    const unsigned char* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, sizeof(f));
        return f;
      }
      case DType::kFloat64: {
        double d;
        std::memcpy(&d, p, sizeof(d));
        return d;
      }
      case DType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, sizeof(v));
        return static_cast<double>(v);
      }
      case DType::kBFloat16: {
        c10::BFloat16 b;
        std::memcpy(&b, p, sizeof(b));
        return static_cast<float>(b);
      }
      case DType::kFloat16: {
        c10::Half h;
        std::memcpy(&h, p, sizeof(h));
        return static_cast<float>(h);
      }
    }
    return 0;
  }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Compares `got` with `want(i)` element by element; reports the first few differences.
template <typename Want>
void expect_values(const Buffer& got, Want want, const std::string& what) {
  int reported = 0;
  for (size_t i = 0; i < got.count() && reported < 5; ++i) {
    if (got.get(i) != want(i)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.get(i) << ", expected "
                    << want(i);
      ++reported;
    }
  }
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
      const size_t total = count * static_cast<size_t>(world);
      salt += 8;
      auto value = [&](int r, size_t i, uint64_t k) { return small_value(seed, r, i, salt + k); };
      auto sum_over_ranks = [&](size_t i, uint64_t k) {
        int64_t s = 0;
        for (int r = 0; r < world; ++r) {
          s += value(r, i, k);
        }
        return static_cast<double>(s);
      };
      auto max_over_ranks = [&](size_t i, uint64_t k) {
        int64_t m = value(0, i, k);
        for (int r = 1; r < world; ++r) {
          m = std::max(m, value(r, i, k));
        }
        return static_cast<double>(m);
      };

      // Several collectives in flight at once, waited for at the end.
      Buffer gather_send(dtype, count);
      Buffer gather_recv(dtype, total);
      Buffer in_place(dtype, total);
      Buffer scatter_send(dtype, total);
      Buffer scatter_sum(dtype, count);
      Buffer scatter_max(dtype, count);
      Buffer reduce_sum(dtype, count);
      Buffer reduce_max(dtype, count);
      Buffer bcast(dtype, count);
      for (size_t i = 0; i < count; ++i) {
        gather_send.set(i, value(rank, i, 0));
        in_place.set(static_cast<size_t>(rank) * count + i, value(rank, i, 1));
        reduce_sum.set(i, value(rank, i, 3));
        reduce_max.set(i, value(rank, i, 4));
        bcast.set(i, value(rank, i, 5));
      }
      for (size_t i = 0; i < total; ++i) {
        scatter_send.set(i, value(rank, i, 2));
      }
      std::vector<WorkPtr> works;
      works.push_back(comm->all_gather(gather_send.data(), gather_recv.data(), count, dtype));
      works.push_back(comm->all_gather(static_cast<char*>(in_place.data()) +
                                           static_cast<size_t>(rank) * count * dtype_size(dtype),
                                       in_place.data(), count, dtype));
      works.push_back(comm->reduce_scatter(scatter_send.data(), scatter_sum.data(), count, dtype));
      works.push_back(comm->reduce_scatter(scatter_send.data(), scatter_max.data(), count, dtype,
                                           ReduceOp::kMax));
      works.push_back(comm->all_reduce(reduce_sum.data(), count, dtype));
      works.push_back(comm->all_reduce(reduce_max.data(), count, dtype, ReduceOp::kMax));
      works.push_back(comm->broadcast(bcast.data(), count, dtype, world - 1));
      works.push_back(comm->barrier());
      for (WorkPtr& work : works) {
        work->wait();
        EXPECT_TRUE(work->completed());
      }

      expect_values(
          gather_recv,
          [&](size_t i) {
            return static_cast<double>(value(static_cast<int>(i / count), i % count, 0));
          },
          "all_gather");
      expect_values(
          in_place,
          [&](size_t i) {
            return static_cast<double>(value(static_cast<int>(i / count), i % count, 1));
          },
          "in-place all_gather");
      const size_t mine = static_cast<size_t>(rank) * count;
      expect_values(
          scatter_sum, [&](size_t i) { return sum_over_ranks(mine + i, 2); }, "reduce_scatter sum");
      expect_values(
          scatter_max, [&](size_t i) { return max_over_ranks(mine + i, 2); }, "reduce_scatter max");
      expect_values(
          reduce_sum, [&](size_t i) { return sum_over_ranks(i, 3); }, "all_reduce sum");
      expect_values(
          reduce_max, [&](size_t i) { return max_over_ranks(i, 4); }, "all_reduce max");
      expect_values(
          bcast, [&](size_t i) { return static_cast<double>(value(world - 1, i, 5)); },
          "broadcast");
    }
  }
  // Zero elements: completes, nothing touched.
  comm->all_reduce(nullptr, 0, DType::kFloat32)->wait();
  comm->barrier()->wait();
}

// Fails every collective of `body` with a CommError; prints it for the launching test, checks
// that the broken communicator refuses the next call at once, then fails the test.
template <typename Body>
void expect_comm_error(Communicator& comm, Body body) {
  const Clock::time_point start = Clock::now();
  try {
    body();
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    std::cout << "COMM_ERROR[" << e.what() << "] after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()
              << " ms" << std::endl;
    const Clock::time_point again = Clock::now();
    try {
      comm.barrier()->wait();
    } catch (const CommError& later) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - again).count();
      if (ms < 100 && std::string(later.what()).find("broken") != std::string::npos) {
        std::cout << "BROKEN_AT_ONCE" << std::endl;
      }
    }
    FAIL() << e.what();
  }
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
  const std::vector<testing::RankResult> results = testing::run_ranks(o);
  for (const testing::RankResult& r : results) {
    EXPECT_TRUE(r.passed()) << testing::describe(r);
  }
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
    EXPECT_FALSE(r.timed_out);
    EXPECT_TRUE(r.exited);
    EXPECT_NE(r.exit_code, 0);
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

void run_missing(int world, const std::vector<int>& started, const std::string& expected) {
  if (testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  testing::RanksOptions o;
  o.world_size = world;
  o.ranks = started;
  o.test = "GlooRank.DISABLED_Rendezvous";
  o.deadline = std::chrono::seconds(40);
  o.env = {{"ZINF_TEST_TIMEOUT_MS", "3000"}};
  const Clock::time_point start = Clock::now();
  const std::vector<testing::RankResult> results = testing::run_ranks(o);
  for (const testing::RankResult& r : results) {
    SCOPED_TRACE(testing::describe(r));
    if (std::getenv("ZINF_TEST_VERBOSE") != nullptr) {
      std::cout << testing::describe(r);
    }
    EXPECT_FALSE(r.timed_out);
    EXPECT_TRUE(r.exited);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("COMM_ERROR[zinf comm: rendezvous on rank " + std::to_string(r.rank)),
              std::string::npos);
    EXPECT_NE(r.output.find(expected), std::string::npos);
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
}

TEST(GlooCommunicator, RankThatNeverArrivesIsNamed) {
  run_missing(3, {0, 1}, "rank 2 of 3 did not join within");
}
TEST(GlooCommunicator, MissingStoreHostIsNamed) {
  run_missing(3, {1, 2}, "rank 0 has not started it");
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
      EXPECT_TRUE(r.passed()) << testing::describe(r);
      if (r.rank == 0) {
        std::cout << r.output;
      }
    }
  }
}

}  // namespace
}  // namespace zinf::zero
