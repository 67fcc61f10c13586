// Tests of OptimizerSwapper: a step over NVMe sub-groups is bit-identical to the same step
// in memory and to optimizer_cpu called directly; every pipelining mode gives the same
// result; I/O faults and corrupted extents surface as errors; the space preflight, the
// buffer_count check, the pinned-memory figure and the counters.
#include "offload/optimizer_swapper.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "aio/fault_backend.h"
#include "offload/cpu_accelerator.h"
#include "offload/error.h"
#include "offload/sub_groups.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/half.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/offload/test_util.h"

namespace zinf::offload {
namespace {

using optimizer_cpu::AdamConfig;
using optimizer_cpu::AdamOptimizer;
using optimizer_cpu::DType;
using testing::random_floats;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kNumel = 10007;  // odd: the last sub-group is short
constexpr uint64_t kSubGroup = 3000;

AdamConfig adam_config() {
  AdamConfig config;
  config.lr = 1e-2f;
  config.beta1 = 0.9f;
  config.beta2 = 0.95f;
  config.weight_decay = 3e-2f;
  return config;
}

NvmeStoreConfig store_config(const std::string& dir, bool checksums) {
  NvmeStoreConfig config;
  config.nvme_path = dir;
  config.name = "optimizer";
  config.checksums = checksums;
  config.aio.backend = aio::BackendKind::kPsync;
  config.aio.intra_op_parallelism = 2;
  return config;
}

struct Outcome {
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::map<uint64_t, std::vector<uint16_t>> copies;  // per sub-group offset, last step
  uint64_t nonfinite = 0;
};

// Three steps with fresh grads each, the grads written in uneven pieces across sub-groups.
struct Problem {
  explicit Problem(uint32_t seed) {
    std::mt19937 rng(seed);
    params = random_floats(rng, kNumel);
    for (int s = 0; s < 3; ++s) {
      grads.push_back(random_floats(rng, kNumel, 100.0f));  // "loss-scaled"
    }
  }
  std::vector<float> params;
  std::vector<std::vector<float>> grads;
};

OptimizerStepOptions options_for(int step) {
  OptimizerStepOptions options;
  options.step = step;
  options.loss_scale = 128.0f;
  options.clip_coefficient = 0.75f;
  return options;
}

// The partition's params, m and v as the swapper has them.
void read_arrays(OptimizerSwapper& swapper, Outcome& out) {
  out.params.resize(kNumel);
  out.exp_avg.resize(kNumel);
  out.exp_avg_sq.resize(kNumel);
  swapper.read_state(OptimizerState::kParams, out.params.data());
  swapper.read_state(OptimizerState::kExpAvg, out.exp_avg.data());
  swapper.read_state(OptimizerState::kExpAvgSq, out.exp_avg_sq.data());
}

Outcome run_swapper(const Problem& problem, OptimizerSwapperConfig config, NvmeStore* store,
                    uint64_t sub_group = kSubGroup) {
  AdamOptimizer adam(adam_config());
  config.sub_groups = cut_sub_groups(kNumel, sub_group).sizes();
  OptimizerSwapper swapper(config, adam, store);
  swapper.initialize(problem.params.data());
  Outcome out;
  for (int s = 0; s < 3; ++s) {
    const std::vector<float>& g = problem.grads[static_cast<size_t>(s)];
    // Uneven pieces: 1234 + 4000 (spans a boundary) + the rest.
    swapper.write_grads(0, g.data(), 1234);
    swapper.write_grads(1234, g.data() + 1234, 4000);
    swapper.write_grads(5234, g.data() + 5234, kNumel - 5234);
    const OptimizerStepReport report =
        swapper.step(options_for(s + 1), [&](uint64_t offset, const void* data, uint64_t numel) {
          auto& copy = out.copies[offset];
          copy.resize(numel);
          std::memcpy(copy.data(), data, numel * 2);
        });
    EXPECT_EQ(report.sub_groups, (kNumel + sub_group - 1) / sub_group);
    out.nonfinite += report.nonfinite_grads;
  }
  read_arrays(swapper, out);
  return out;
}

// optimizer_cpu called directly, sub-group by sub-group, on plain arrays, for `steps` steps.
Outcome run_direct(const Problem& problem, int steps = 3, uint64_t sub_group = kSubGroup) {
  AdamOptimizer adam(adam_config());
  Outcome out;
  out.params = problem.params;
  out.exp_avg.assign(kNumel, 0.0f);
  out.exp_avg_sq.assign(kNumel, 0.0f);
  for (int s = 0; s < steps; ++s) {
    for (uint64_t offset = 0; offset < kNumel; offset += sub_group) {
      const uint64_t n = std::min(sub_group, kNumel - offset);
      std::vector<uint16_t>& copy = out.copies[offset];
      copy.resize(n);
      optimizer_cpu::StepArgs args;
      args.params = out.params.data() + offset;
      args.grads = problem.grads[static_cast<size_t>(s)].data() + offset;
      args.exp_avg = out.exp_avg.data() + offset;
      args.exp_avg_sq = out.exp_avg_sq.data() + offset;
      args.numel = n;
      args.grad_scale = 0.75f / 128.0f;
      args.param_copy = copy.data();
      args.param_copy_dtype = DType::kBFloat16;
      args.step = s + 1;
      out.nonfinite += adam.step(args).nonfinite_grads;
    }
  }
  return out;
}

void expect_identical(const Outcome& a, const Outcome& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), kNumel * 4), 0) << "params differ";
  EXPECT_EQ(std::memcmp(a.exp_avg.data(), b.exp_avg.data(), kNumel * 4), 0) << "m differs";
  EXPECT_EQ(std::memcmp(a.exp_avg_sq.data(), b.exp_avg_sq.data(), kNumel * 4), 0) << "v differs";
  EXPECT_EQ(a.copies, b.copies) << "16-bit copies differ";
  EXPECT_EQ(a.nonfinite, b.nonfinite);
}

TEST(OptimizerSwapper, NvmeStepIsBitIdenticalToInMemoryAndPipeliningChangesNothing) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  const Outcome direct = run_direct(problem);
  // The step really moved the params, and the copy is their bf16 rounding.
  EXPECT_NE(std::memcmp(direct.params.data(), problem.params.data(), kNumel * 4), 0);
  EXPECT_EQ(direct.copies.at(3000)[5], optimizer_cpu::float_to_bf16(direct.params[3005]));

  OptimizerSwapperConfig cpu;
  cpu.device = OffloadDevice::kCpu;
  expect_identical(run_swapper(problem, cpu, nullptr), direct, "device cpu");

  for (const bool checksums : {false, true}) {
    for (int mode = 0; mode < 4; ++mode) {
      TempDir dir;
      NvmeStore store(store_config(dir.path(), checksums));
      OptimizerSwapperConfig nvme;
      nvme.pipeline_read = (mode & 1) != 0;
      nvme.pipeline_write = (mode & 2) != 0;
      expect_identical(run_swapper(problem, nvme, &store), direct,
                       "nvme, pipeline_read " + std::to_string(nvme.pipeline_read) +
                           ", pipeline_write " + std::to_string(nvme.pipeline_write) +
                           ", checksums " + std::to_string(checksums));
    }
  }
}

// The sets keep the sub-group they last updated: with one set per sub-group (1 or 2
// sub-groups here, grads kept in the sets only) and with fewer sets than sub-groups, in
// every pipelining mode, three steps give what plain arrays give.
TEST(OptimizerSwapper, SetsKeptAcrossStepsChangeNoResult) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  for (const uint64_t sub_group : {kNumel, uint64_t{5004}, kSubGroup}) {
    const Outcome direct = run_direct(problem, 3, sub_group);
    for (const bool checksums : {false, true}) {
      for (int mode = 0; mode < 4; ++mode) {
        TempDir dir;
        NvmeStore store(store_config(dir.path(), checksums));
        OptimizerSwapperConfig nvme;
        nvme.pipeline_read = (mode & 1) != 0;
        nvme.pipeline_write = (mode & 2) != 0;
        expect_identical(run_swapper(problem, nvme, &store, sub_group), direct,
                         "sub_group " + std::to_string(sub_group) + ", mode " +
                             std::to_string(mode) + ", checksums " + std::to_string(checksums));
      }
    }
  }
}

// A StepObserver that checks the swapper's promise: every sub-group is shown once per step,
// in order, with its final values (the step's result), and what it was shown stays unchanged
// until the swapper releases it; step() returns with nothing unreleased. It collects what it
// saw into whole arrays.
class CheckingObserver final : public StepObserver {
 public:
  explicit CheckingObserver(uint64_t numel)
      : seen_{std::vector<float>(numel), std::vector<float>(numel), std::vector<float>(numel)} {}

  void updated(size_t sub_group, uint64_t numel, const OptimizerState* kinds,
               const void* const* arrays, size_t count) noexcept override {
    EXPECT_EQ(sub_group, next_) << "shown out of order";
    next_ = sub_group + 1;
    Shown shown{sub_group, {}, {}};
    for (size_t k = 0; k < count; ++k) {
      if (kinds[k] == OptimizerState::kGrads) {
        EXPECT_EQ(arrays[k], nullptr) << "grads are not shown";
        continue;
      }
      const auto* data = static_cast<const float*>(arrays[k]);
      shown.arrays.push_back(data);
      shown.copies.emplace_back(data, data + numel);
      const size_t slot = kinds[k] == OptimizerState::kParams   ? 0
                          : kinds[k] == OptimizerState::kExpAvg ? 1
                                                                : 2;
      std::copy(data, data + numel,
                seen_[slot].begin() + static_cast<std::ptrdiff_t>(sub_group * sub_group_size));
    }
    EXPECT_EQ(shown.arrays.size(), 3u);
    outstanding_.push_back(std::move(shown));
  }

  void release(size_t sub_group) noexcept override {
    ++releases_;
    while (!outstanding_.empty() && outstanding_.front().sub_group <= sub_group) {
      const Shown& s = outstanding_.front();
      for (size_t a = 0; a < s.arrays.size(); ++a) {
        EXPECT_EQ(std::memcmp(s.arrays[a], s.copies[a].data(), s.copies[a].size() * 4), 0)
            << "sub-group " << s.sub_group << " array " << a << " changed before its release";
      }
      outstanding_.pop_front();
    }
  }

  // After a step: everything was released; ready for the next step.
  void end_step(size_t sub_groups) {
    EXPECT_TRUE(outstanding_.empty()) << outstanding_.size() << " sub-groups unreleased";
    EXPECT_EQ(next_, sub_groups);
    outstanding_.clear();
    next_ = 0;
  }

  uint64_t sub_group_size = 0;
  const std::vector<float>& seen(size_t slot) const { return seen_[slot]; }
  size_t releases() const { return releases_; }

 private:
  struct Shown {
    size_t sub_group;
    std::vector<const float*> arrays;
    std::vector<std::vector<float>> copies;
  };
  std::vector<std::vector<float>> seen_;  // params, m, v
  std::deque<Shown> outstanding_;
  size_t next_ = 0;
  size_t releases_ = 0;
};

// The observer sees each sub-group's final values, unchanged until released, in every
// pipelining mode and on both devices, and watching changes no result.
TEST(OptimizerSwapper, AStepObserverSeesTheUpdatedArraysUntilItReleasesThem) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  for (const uint64_t sub_group : {kNumel, uint64_t{5004}, kSubGroup}) {
    const Outcome direct = run_direct(problem, 3, sub_group);
    for (int mode = 0; mode < 5; ++mode) {  // 4: device kCpu
      SCOPED_TRACE("sub_group " + std::to_string(sub_group) + ", mode " + std::to_string(mode));
      TempDir dir;
      NvmeStore store(store_config(dir.path(), true));
      OptimizerSwapperConfig config;
      config.sub_groups = cut_sub_groups(kNumel, sub_group).sizes();
      config.pipeline_read = (mode & 1) != 0;
      config.pipeline_write = (mode & 2) != 0;
      if (mode == 4) config.device = OffloadDevice::kCpu;
      AdamOptimizer adam(adam_config());
      OptimizerSwapper swapper(config, adam, mode == 4 ? nullptr : &store);
      swapper.initialize(problem.params.data());
      CheckingObserver observer(kNumel);
      observer.sub_group_size = sub_group;
      Outcome out;
      for (int s = 0; s < 3; ++s) {
        swapper.write_grads(0, problem.grads[static_cast<size_t>(s)].data(), kNumel);
        // Watched on the first and last steps only: a step without it in between.
        swapper.set_step_observer(s != 1 ? &observer : nullptr);
        (void)swapper.step(options_for(s + 1), [&](uint64_t offset, const void* data, uint64_t n) {
          auto& copy = out.copies[offset];
          copy.resize(n);
          std::memcpy(copy.data(), data, n * 2);
        });
        if (s != 1) observer.end_step(swapper.sub_group_count());
      }
      swapper.set_step_observer(nullptr);
      EXPECT_GE(observer.releases(), 2u);
      read_arrays(swapper, out);
      expect_identical(out, direct, "watched");
      EXPECT_EQ(observer.seen(0), out.params);
      EXPECT_EQ(observer.seen(1), out.exp_avg);
      EXPECT_EQ(observer.seen(2), out.exp_avg_sq);
    }
  }
}

// A sub-group the sets hold is read from them, not from the disk: with one sub-group, the
// second step reads nothing from NVMe and writes params, m and v once; the grads never reach
// the disk. Writes between steps (a checkpoint load) reach the next step.
TEST(OptimizerSwapper, HeldSubGroupsAreNotReadBackAndWritesBetweenStepsAreSeen) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  // The reference: step 1, then the params replaced (by the second grads array, any values
  // will do), then step 2.
  Outcome direct;
  {
    const Outcome one = run_direct(problem, 1, kNumel);
    AdamOptimizer adam(adam_config());
    direct.params = problem.grads[1];
    direct.exp_avg = one.exp_avg;
    direct.exp_avg_sq = one.exp_avg_sq;
    optimizer_cpu::StepArgs args;
    args.params = direct.params.data();
    args.grads = problem.grads[2].data();
    args.exp_avg = direct.exp_avg.data();
    args.exp_avg_sq = direct.exp_avg_sq.data();
    args.numel = kNumel;
    args.grad_scale = 0.75f / 128.0f;
    args.step = 2;
    (void)adam.step(args);
  }
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE("mode " + std::to_string(mode));
    TempDir dir;
    NvmeStore store(store_config(dir.path(), true));
    AdamOptimizer adam(adam_config());
    OptimizerSwapperConfig config;
    config.sub_groups = cut_sub_groups(kNumel, kNumel).sizes();
    config.pipeline_read = (mode & 1) != 0;
    config.pipeline_write = (mode & 2) != 0;
    OptimizerSwapper swapper(config, adam, &store);
    swapper.initialize(problem.params.data());
    swapper.write_grads(0, problem.grads[0].data(), kNumel);
    (void)swapper.step(options_for(1));
    swapper.load_state(OptimizerState::kParams, problem.grads[1].data());
    swapper.reset_counters();
    swapper.write_grads(0, problem.grads[2].data(), 5000);  // in two pieces
    swapper.write_grads(5000, problem.grads[2].data() + 5000, kNumel - 5000);
    (void)swapper.step(options_for(2));
    swapper.flush();
    const OffloadCounters c = swapper.counters();
    EXPECT_EQ(c.nvme_bytes_read, 0u);
    EXPECT_EQ(c.nvme_bytes_written, kNumel * 12);  // params, m, v
    Outcome out;
    read_arrays(swapper, out);
    EXPECT_EQ(std::memcmp(out.params.data(), direct.params.data(), kNumel * 4), 0);
    EXPECT_EQ(std::memcmp(out.exp_avg.data(), direct.exp_avg.data(), kNumel * 4), 0);
    EXPECT_EQ(std::memcmp(out.exp_avg_sq.data(), direct.exp_avg_sq.data(), kNumel * 4), 0);
    // A save copies straight from the set.
    const void* held = swapper.held(OptimizerState::kExpAvg, 0);
    ASSERT_NE(held, nullptr);
    EXPECT_EQ(std::memcmp(held, direct.exp_avg.data(), kNumel * 4), 0);
    EXPECT_EQ(swapper.held(OptimizerState::kGrads, 0), nullptr) << "consumed by the step";
  }
  // Four sub-groups through one set: only the last one updated is held.
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  OptimizerSwapper swapper(config, adam, &store);
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  (void)swapper.step(options_for(1));
  const Outcome one = run_direct(problem, 1);
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(swapper.held(OptimizerState::kParams, g), nullptr) << "sub-group " << g;
  }
  const void* last = swapper.held(OptimizerState::kParams, 3);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(std::memcmp(last, one.params.data() + 3 * kSubGroup, (kNumel - 3 * kSubGroup) * 4), 0);
}

// The sets' queues have the state buffers registered: on io_uring the step's transfers use
// fixed buffers, and the results stay bit-identical in every pipelining mode.
TEST(OptimizerSwapper, StepTransfersUseFixedBuffersOnIoUringWithUnchangedResults) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  const Outcome direct = run_direct(problem);
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE("mode " + std::to_string(mode));
    TempDir dir;
    NvmeStoreConfig sc = store_config(dir.path(), /*checksums=*/true);
    sc.aio.backend = aio::BackendKind::kIoUring;
    NvmeStore store(sc);
    OptimizerSwapperConfig nvme;
    nvme.pipeline_read = (mode & 1) != 0;
    nvme.pipeline_write = (mode & 2) != 0;
    expect_identical(run_swapper(problem, nvme, &store), direct, "io_uring");
    const NvmeStoreStats stats = store.stats();
    // Every step reads and writes each of the 4 sub-groups' arrays from pool buffers; the
    // loads, grads and read_state calls go through caller memory (not registered).
    EXPECT_GT(stats.fixed_io_requests, 0u)
        << "no fixed-buffer requests (io_uring refused the registration: RLIMIT_MEMLOCK?)";
    EXPECT_LT(stats.fixed_io_requests, stats.io_requests);
  }
}

TEST(OptimizerSwapper, TmpfsAndBf16GradsMatchInMemory) {
  if (!testing::have_dev_shm()) {
    GTEST_SKIP() << "no /dev/shm";
  }
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const std::vector<float> params = random_floats(rng, kNumel);
  std::vector<uint16_t> grads(kNumel);
  for (auto& g : grads) {
    g = optimizer_cpu::float_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
  }
  auto run = [&](OffloadDevice device, NvmeStore* store) {
    AdamOptimizer adam(adam_config());
    OptimizerSwapperConfig config;
    config.device = device;
    config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
    config.grad_dtype = DType::kBFloat16;
    config.pipeline_read = config.pipeline_write = true;
    OptimizerSwapper swapper(config, adam, store);
    swapper.initialize(params.data());
    swapper.write_grads(0, grads.data(), kNumel);
    OptimizerStepOptions options;
    options.copy_params = false;
    (void)swapper.step(options);
    std::vector<float> out(kNumel);
    swapper.read_state(OptimizerState::kParams, out.data());
    return out;
  };
  TempDir dir("/dev/shm");
  NvmeStore store(store_config(dir.path(), true));
  const std::vector<float> in_memory = run(OffloadDevice::kCpu, nullptr);
  const std::vector<float> on_tmpfs = run(OffloadDevice::kNvme, &store);
  EXPECT_EQ(std::memcmp(in_memory.data(), on_tmpfs.data(), kNumel * 4), 0);
}

TEST(OptimizerSwapper, PinnedMemoryIsFixedByTheConfigAndCountersAddUp) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  CpuAccelerator accelerator(0);
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  config.pipeline_read = config.pipeline_write = true;
  OptimizerSwapper swapper(config, adam, &store, &accelerator);
  // 3 sets x (4 state buffers of 3000 x 4 bytes -> 12288 + one copy buffer 6000 -> 8192).
  EXPECT_EQ(swapper.pinned_bytes(), 3u * (4u * 12288u + 8192u));
  EXPECT_EQ(accelerator.registered_host_bytes(), swapper.pinned_bytes());
  std::vector<float> zeros(kNumel, 0.0f);
  swapper.initialize(zeros.data());
  swapper.write_grads(0, zeros.data(), kNumel);
  swapper.reset_counters();
  (void)swapper.step(OptimizerStepOptions{});
  const OffloadCounters c = swapper.counters();
  EXPECT_EQ(c.nvme_bytes_read, kNumel * 16);     // params, grads, m, v
  EXPECT_EQ(c.nvme_bytes_written, kNumel * 12);  // params, m, v
  EXPECT_EQ(c.pool_buffers, 3u * 4u + 3u);
  EXPECT_EQ(c.pool_high_water, 3u * 4u + 3u);
  EXPECT_GT(c.compute_seconds, 0.0);
  EXPECT_EQ(c.pinned_bytes, swapper.pinned_bytes());
  EXPECT_FALSE(c.to_string().empty());
}

// Grads in host memory (grads_in_memory, zinf.grad_offload "cpu"): every pipelining mode,
// with one sub-group or several, gives what plain arrays give; the step reads and writes only
// p, m and v on NVMe, the sets have no grad buffer, and the footprint says so.
TEST(OptimizerSwapper, GradsInMemoryGiveTheSameStepsAndNeverReachTheDisk) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  for (const uint64_t sub_group : {kNumel, kSubGroup}) {
    const Outcome direct = run_direct(problem, 3, sub_group);
    for (int mode = 0; mode < 4; ++mode) {
      TempDir dir;
      NvmeStore store(store_config(dir.path(), mode == 1));
      OptimizerSwapperConfig nvme;
      nvme.pipeline_read = (mode & 1) != 0;
      nvme.pipeline_write = (mode & 2) != 0;
      nvme.grads_in_memory = true;
      expect_identical(run_swapper(problem, nvme, &store, sub_group), direct,
                       "grads in memory, sub_group " + std::to_string(sub_group) + ", mode " +
                           std::to_string(mode));
    }
  }
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  CpuAccelerator accelerator(0);
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  config.pipeline_read = config.pipeline_write = true;
  config.grads_in_memory = true;
  OptimizerSwapper swapper(config, adam, &store, &accelerator);
  // 3 sets x (3 state buffers of 3000 x 4 bytes -> 12288 + one copy buffer 6000 -> 8192).
  EXPECT_EQ(swapper.pinned_bytes(), 3u * (3u * 12288u + 8192u));
  const Footprint f = OptimizerSwapper::footprint(config, adam.state_arrays());
  EXPECT_EQ(f.pinned, swapper.pinned_bytes());
  EXPECT_EQ(f.host, kNumel * 4);
  EXPECT_EQ(f.nvme, store.stats().file_bytes);
  ASSERT_NE(swapper.memory(OptimizerState::kGrads), nullptr);
  EXPECT_EQ(swapper.memory(OptimizerState::kParams), nullptr);
  std::mt19937 rng(seed);
  const std::vector<float> grads = random_floats(rng, kNumel);
  swapper.initialize(problem.params.data());
  std::memcpy(swapper.memory(OptimizerState::kGrads), grads.data(), kNumel * 4);  // in place
  std::vector<float> back(kNumel);
  swapper.read_state(OptimizerState::kGrads, back.data());
  EXPECT_EQ(back, grads);
  swapper.reset_counters();
  (void)swapper.step(OptimizerStepOptions{});
  const OffloadCounters c = swapper.counters();
  EXPECT_EQ(c.nvme_bytes_read, kNumel * 12);     // params, m, v (the grads from memory)
  EXPECT_EQ(c.nvme_bytes_written, kNumel * 12);  // params, m, v
  EXPECT_EQ(c.pool_buffers, 3u * 3u + 3u);
}

TEST(OptimizerSwapper, TooFewBuffersFailAtConstructionWithTheNumbers) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kNumel).sizes();  // one sub-group
  config.buffer_count = 3;
  try {
    OptimizerSwapper swapper(config, adam, &store);
    FAIL() << "buffer_count 3 accepted for Adam";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("buffer_count is 3 but adamw needs 4"), std::string::npos)
        << e.what();
  }
}

TEST(OptimizerSwapper, OutOfSpaceIsReportedBeforeAnyWork) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups =
      cut_sub_groups(uint64_t{1} << 42, uint64_t{1} << 28).sizes();  // 64 TiB of states
  try {
    OptimizerSwapper swapper(config, adam, &store);
    FAIL() << "64 TiB of optimizer states accepted";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace);
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    EXPECT_NE(message.find("needs " + std::to_string(uint64_t{1} << 46)), std::string::npos)
        << message;
  }
}

// A swapper gives its extents back when it is destroyed, so swappers made one after another
// on one store reuse the same space: the swap file does not grow with every one.
TEST(OptimizerSwapper, DestroyedSwapperReturnsItsExtents) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  std::vector<NvmeStoreStats> during, after;
  std::vector<uint64_t> file_sizes;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    {
      AdamOptimizer adam(adam_config());
      OptimizerSwapperConfig config;
      config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
      config.pipeline_read = config.pipeline_write = true;
      OptimizerSwapper swapper(config, adam, &store);
      swapper.initialize(problem.params.data());
      swapper.write_grads(0, problem.grads[0].data(), kNumel);
      (void)swapper.step(options_for(1));
      during.push_back(store.stats());
    }
    after.push_back(store.stats());
    file_sizes.push_back(std::filesystem::file_size(store.path()));
    uint64_t probe_offset = 0;
    EXPECT_TRUE(testing::holds_no_extent(store, &probe_offset));
    EXPECT_EQ(probe_offset, 0u);
  }
  // 4 arrays x (3 sub-groups of 12288 bytes + one of 4096) in the file.
  EXPECT_EQ(during[0].file_bytes, 4u * (3u * 12288u + 4096u));
  for (size_t round = 0; round < after.size(); ++round) {
    EXPECT_EQ(during[round].file_bytes, during[0].file_bytes) << "round " << round;
    EXPECT_EQ(during[round].reserved_bytes, during[0].reserved_bytes) << "round " << round;
    // Destroyed, the swapper's extents are free and the store gives the tail back.
    EXPECT_EQ(after[round].file_bytes, 0u) << "round " << round;
    EXPECT_EQ(file_sizes[round], 0u) << "round " << round;
  }
}

// A constructor that fails after it allocated its extents gives them back: failures injected
// at the first host registration (the state pool, after the space check) and at the last
// (the copy pool, after the I/O queues were made). A working swapper made next on the same
// store takes exactly the space of one.
class OptimizerSwapperFailedConstruction : public ::testing::TestWithParam<uint64_t> {};

TEST_P(OptimizerSwapperFailedConstruction, LeavesTheStoreAsItWas) {
  const uint64_t fail_at = GetParam();
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  config.pipeline_read = true;  // 2 sets: 8 state buffers, then 2 copy buffers registered
  {
    testing::RefusingAccelerator accelerator(fail_at);
    try {
      OptimizerSwapper swapper(config, adam, &store, &accelerator);
      FAIL() << "registration " << fail_at << " refused, yet the swapper was made";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kDevice) << e.what();
    }
    EXPECT_EQ(accelerator.calls(), fail_at);
    EXPECT_EQ(accelerator.registered_host_bytes(), 0u);
  }
  uint64_t probe_offset = 0;
  EXPECT_TRUE(testing::holds_no_extent(store, &probe_offset));
  EXPECT_EQ(probe_offset, 0u);
  OptimizerSwapper swapper(config, adam, &store);
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  (void)swapper.step(options_for(1));
  EXPECT_EQ(store.stats().file_bytes, 4u * (3u * 12288u + 4096u));
  std::vector<float> params(kNumel);
  swapper.read_state(OptimizerState::kParams, params.data());
  EXPECT_EQ(std::memcmp(params.data(), run_direct(problem, 1).params.data(), kNumel * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(InjectedRegistrationFailure, OptimizerSwapperFailedConstruction,
                         ::testing::Values(uint64_t{1}, uint64_t{10}));

// Out of space: the constructor's space check fails after every extent was allocated; they
// are all given back (the store's end of file is the store's business: see NvmeStore).
TEST(OptimizerSwapper, OutOfSpaceConstructionGivesItsExtentsBack) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  // 64 TiB of states: 256 sub-groups, 1024 extents.
  config.sub_groups = cut_sub_groups(uint64_t{1} << 42, uint64_t{1} << 34).sizes();
  EXPECT_THROW(OptimizerSwapper(config, adam, &store), OffloadError);
  uint64_t probe_offset = 0;
  EXPECT_TRUE(testing::holds_no_extent(store, &probe_offset));
  EXPECT_EQ(probe_offset, 0u);
  // The store is not wedged by the refused 64 TiB: a swapper that fits works.
  const Problem problem(7);
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  OptimizerSwapper swapper(config, adam, &store);
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  EXPECT_NO_THROW((void)swapper.step(options_for(1)));
}

// What every fault test builds: an OptimizerSwapper in pipelining `mode` over an NvmeStore
// on `backend` whose backend injects `faults`, holding the problem's params and first grads.
// `intra_op_parallelism` 0 keeps store_config's.
struct FaultRig {
  FaultRig(const Problem& problem, int mode, aio::BackendKind backend, bool checksums,
           int intra_op_parallelism = 0)
      : store(rig_store_config(dir.path(), checksums, backend, intra_op_parallelism, faults)),
        adam(adam_config()),
        swapper(rig_swapper_config(mode), adam, &store) {
    swapper.initialize(problem.params.data());
    swapper.write_grads(0, problem.grads[0].data(), kNumel);
  }

  static NvmeStoreConfig rig_store_config(const std::string& dir, bool checksums,
                                          aio::BackendKind backend, int intra_op_parallelism,
                                          const std::shared_ptr<aio::FaultInjector>& faults) {
    NvmeStoreConfig config = store_config(dir, checksums);
    if (intra_op_parallelism > 0) {
      config.aio.intra_op_parallelism = intra_op_parallelism;
    }
    config.aio.backend = backend;
    config.backend_factory = aio::fault_backend_factory(faults);
    return config;
  }
  static OptimizerSwapperConfig rig_swapper_config(int mode) {
    OptimizerSwapperConfig config;
    config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
    config.pipeline_read = (mode & 1) != 0;
    config.pipeline_write = (mode & 2) != 0;
    return config;
  }

  TempDir dir;
  std::shared_ptr<aio::FaultInjector> faults = std::make_shared<aio::FaultInjector>();
  NvmeStore store;
  AdamOptimizer adam;
  OptimizerSwapper swapper;
};

// Fault paths, in every pipelining mode (0-3: pipeline_read | pipeline_write << 1) and on
// every aio backend, the faults injected through a FaultBackend wrapped around it.
class OptimizerSwapperFaults : public ::testing::TestWithParam<std::tuple<int, aio::BackendKind>> {
};

TEST_P(OptimizerSwapperFaults, ReadFaultMidStepIsReportedNotApplied) {
  const int mode = std::get<0>(GetParam());
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  FaultRig rig(problem, mode, std::get<1>(GetParam()), /*checksums=*/false);
  OptimizerSwapper& swapper = rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  // Fail a read of the third sub-group's states. The swapper allocates its extents sub-group
  // by sub-group, 4 arrays each of 3000 x 4 bytes (12288 in the file).
  constexpr uint64_t kGroupFileBytes = 4 * 12288;
  constexpr size_t kFailing = 2;
  faults->add(aio::FaultRule{.op = aio::Op::kRead,
                             .offset_begin = kFailing * kGroupFileBytes,
                             .offset_end = (kFailing + 1) * kGroupFileBytes,
                             .nth = 3,
                             .count = 1,
                             .kind = aio::FaultKind::kError,
                             .error = EIO});
  try {
    (void)swapper.step(options_for(1));
    FAIL() << "injected EIO during the step not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
  EXPECT_EQ(faults->fired(0), 1u);
  // Not applied: the failing sub-group and those after it are as before the step; the ones
  // before it were updated (and written, pipelined or not) exactly as a plain step does.
  {
    const Outcome one_step = run_direct(problem, 1);
    std::vector<float> params(kNumel), exp_avg(kNumel);
    swapper.read_state(OptimizerState::kParams, params.data());
    swapper.read_state(OptimizerState::kExpAvg, exp_avg.data());
    const uint64_t split = kFailing * kSubGroup;
    EXPECT_EQ(std::memcmp(params.data(), one_step.params.data(), split * 4), 0);
    EXPECT_EQ(std::memcmp(exp_avg.data(), one_step.exp_avg.data(), split * 4), 0);
    EXPECT_EQ(
        std::memcmp(params.data() + split, problem.params.data() + split, (kNumel - split) * 4), 0)
        << "a sub-group whose read failed, or a later one, was updated";
    EXPECT_TRUE(std::all_of(exp_avg.begin() + static_cast<std::ptrdiff_t>(split), exp_avg.end(),
                            [](float m) { return m == 0.0f; }));
  }
  // A write fault tears an extent; reading it back is then an error, not stale data.
  faults->clear();
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .nth = 2,
                             .count = 1,
                             .kind = aio::FaultKind::kError,
                             .error = ENOSPC});
  EXPECT_THROW((void)swapper.step(options_for(2)), OffloadError);
  faults->clear();
  std::vector<float> out(kNumel);
  int torn = 0;
  for (OptimizerState state :
       {OptimizerState::kParams, OptimizerState::kExpAvg, OptimizerState::kExpAvgSq}) {
    try {
      swapper.read_state(state, out.data());
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      ++torn;
    }
  }
  EXPECT_GE(torn, 1) << "a failed write left no torn extent behind";
}

// An engine failure breaks the aio handle of the set's queue it struck for good: the next
// step must run on a fresh queue, with the same result as a step that never saw a fault.
// One worker per handle, so the broken worker is the one every later transfer would use.
TEST_P(OptimizerSwapperFaults, EngineFailureDoesNotPoisonLaterSteps) {
  const int mode = std::get<0>(GetParam());
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  FaultRig rig(problem, mode, std::get<1>(GetParam()), /*checksums=*/true,
               /*intra_op_parallelism=*/1);
  NvmeStore& store = rig.store;
  OptimizerSwapper& swapper = rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  // Break the engine on a read of the second sub-group's states (4 arrays of 12288 bytes
  // in the file per sub-group, allocated in order).
  constexpr uint64_t kGroupFileBytes = 4 * 12288;
  faults->add(aio::FaultRule{.op = aio::Op::kRead,
                             .offset_begin = kGroupFileBytes,
                             .offset_end = 2 * kGroupFileBytes,
                             .kind = aio::FaultKind::kEngine,
                             .error = EBADF});
  try {
    (void)swapper.step(options_for(1));
    FAIL() << "the broken engine was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    EXPECT_NE(message.find("at offset "), std::string::npos) << message;
    EXPECT_NE(message.find("engine failed"), std::string::npos) << message;
  }
  EXPECT_EQ(faults->fired(0), 1u);
  // Restore the states (as from a checkpoint) and step again: every set's queue works.
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  (void)swapper.step(options_for(1));
  const Outcome one_step = run_direct(problem, 1);
  std::vector<float> params(kNumel), exp_avg(kNumel), exp_avg_sq(kNumel);
  swapper.read_state(OptimizerState::kParams, params.data());
  swapper.read_state(OptimizerState::kExpAvg, exp_avg.data());
  swapper.read_state(OptimizerState::kExpAvgSq, exp_avg_sq.data());
  EXPECT_EQ(std::memcmp(params.data(), one_step.params.data(), kNumel * 4), 0);
  EXPECT_EQ(std::memcmp(exp_avg.data(), one_step.exp_avg.data(), kNumel * 4), 0);
  EXPECT_EQ(std::memcmp(exp_avg_sq.data(), one_step.exp_avg_sq.data(), kNumel * 4), 0);
}

TEST_P(OptimizerSwapperFaults, ShortWriteThenErrorMidStepIsReportedNotApplied) {
  const int mode = std::get<0>(GetParam());
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  // intra_op_parallelism 1: one request per aligned run, so the short one is predictable.
  FaultRig rig(problem, mode, std::get<1>(GetParam()), /*checksums=*/true,
               /*intra_op_parallelism=*/1);
  NvmeStore& store = rig.store;
  OptimizerSwapper& swapper = rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  // The step's write of sub-group 1's params (12000 bytes at 4 x 12288) comes back short
  // (4096 bytes), and the write of its remainder fails with ENOSPC.
  constexpr uint64_t kParams1 = 4 * 12288;
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .offset_begin = kParams1,
                             .offset_end = kParams1 + 1,
                             .kind = aio::FaultKind::kShort,
                             .short_bytes = 4096});
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .offset_begin = kParams1 + 4096,
                             .offset_end = kParams1 + 4097,
                             .kind = aio::FaultKind::kError,
                             .error = ENOSPC});
  try {
    (void)swapper.step(options_for(1));
    FAIL() << "a short write followed by ENOSPC was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  EXPECT_EQ(faults->fired(0), 1u) << "no short write";
  EXPECT_EQ(faults->fired(1), 1u) << "no error on the continuation";
  faults->clear();
  // The half-written params are never read back as data; sub-group 0 was fully updated.
  std::vector<float> group(kSubGroup);
  try {
    swapper.read_sub_group(OptimizerState::kParams, 1, group.data());
    FAIL() << "params of sub-group 1 whose write came back short and failed were read";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
  }
  const Outcome one_step = run_direct(problem, 1);
  swapper.read_sub_group(OptimizerState::kParams, 0, group.data());
  EXPECT_EQ(std::memcmp(group.data(), one_step.params.data(), kSubGroup * 4), 0);
  // Restored (as from a checkpoint), the next step gives the plain result.
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  (void)swapper.step(options_for(1));
  std::vector<float> params(kNumel);
  swapper.read_state(OptimizerState::kParams, params.data());
  EXPECT_EQ(std::memcmp(params.data(), one_step.params.data(), kNumel * 4), 0);
}

// The last sub-group's writes run on after step() returns: an error in them is thrown by the
// next call (flush here), names the swap file, and drops what the sets held, so the torn
// extent is reported as corrupt instead of being served from memory.
TEST_P(OptimizerSwapperFaults, LastSubGroupWriteErrorIsReportedByTheNextCall) {
  const int mode = std::get<0>(GetParam());
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  FaultRig rig(problem, mode, std::get<1>(GetParam()), /*checksums=*/true,
               /*intra_op_parallelism=*/1);
  OptimizerSwapper& swapper = rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  // Sub-group 3 (the last, 1007 elements) has its params extent at 3 x 4 x 12288.
  constexpr uint64_t kParams3 = 3 * 4 * 12288;
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .offset_begin = kParams3,
                             .offset_end = kParams3 + 1,
                             .kind = aio::FaultKind::kError,
                             .error = EIO});
  (void)swapper.step(options_for(1));  // the failing write may still be in flight
  try {
    swapper.flush();
    FAIL() << "the failed write of the last sub-group was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(rig.store.path()), std::string::npos) << e.what();
  }
  EXPECT_EQ(faults->fired(0), 1u);
  faults->clear();
  swapper.flush();  // reported once
  std::vector<float> group(1007);
  try {
    swapper.read_sub_group(OptimizerState::kParams, 3, group.data());
    FAIL() << "params of the sub-group whose write failed were served";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
  }
  // Sub-groups 0-2 were written: their updated values are on disk.
  const Outcome one_step = run_direct(problem, 1);
  std::vector<float> first(kSubGroup);
  swapper.read_sub_group(OptimizerState::kParams, 0, first.data());
  EXPECT_EQ(std::memcmp(first.data(), one_step.params.data(), kSubGroup * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(
    PipeliningAndBackends, OptimizerSwapperFaults,
    ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::ValuesIn(testing::all_backends())),
    [](const ::testing::TestParamInfo<std::tuple<int, aio::BackendKind>>& param_info) {
      std::string name = "mode";
      name.append(std::to_string(std::get<0>(param_info.param)));
      name.append("_");
      name.append(aio::to_string(std::get<1>(param_info.param)));
      return name;
    });

TEST(OptimizerSwapper, CorruptedExtentFailsTheStepNamingFileAndOffset) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  config.pipeline_read = true;
  OptimizerSwapper swapper(config, adam, &store);
  swapper.initialize(problem.params.data());
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  // Flip a byte somewhere in the middle of the file: some sub-group's state.
  const int fd = ::open(store.path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t where = 5 * 4096 + 17;
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, where), 1);
  byte ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &byte, 1, where), 1);
  ::close(fd);
  try {
    (void)swapper.step(options_for(1));
    FAIL() << "corrupted extent applied silently";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
  }
}

// The rule every layer cuts sub-groups with (offload/sub_groups.h).
TEST(SubGroupCut, ConsecutiveSubGroupsOfTheSizeTheLastShorter) {
  EXPECT_EQ(cut_sub_groups(10, 4).sizes(), (std::vector<uint64_t>{4, 4, 2}));
  EXPECT_EQ(cut_sub_groups(10, 4).largest(), 4u);
  EXPECT_EQ(cut_sub_groups(8, 4).sizes(), (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(cut_sub_groups(3, 10).sizes(), (std::vector<uint64_t>{3}));
  EXPECT_EQ(cut_sub_groups(3, 10).largest(), 3u);
  EXPECT_TRUE(cut_sub_groups(0, 10).sizes().empty());
  EXPECT_EQ(cut_sub_groups(0, 10).largest(), 0u);
  // Counted, not listed: 2^40 sub-groups of one element.
  const SubGroupCut tiny = cut_sub_groups(uint64_t{1} << 40, 1);
  EXPECT_EQ(tiny.count, uint64_t{1} << 40);
  EXPECT_EQ(tiny.numel(tiny.count - 1), 1u);
  EXPECT_THROW((void)cut_sub_groups(10, 0), std::invalid_argument);
}

// ---- speculative updates (config.speculate) -------------------------------------------------

// The sub-groups of the partition, last first (the backward's order), as pieces of `grads`.
std::vector<size_t> backward_order(const OptimizerSwapper& swapper) {
  std::vector<size_t> order;
  for (size_t g = swapper.sub_group_count(); g-- > 0;) order.push_back(g);
  return order;
}

// Speculated then committed (step 1) and speculated then rolled back and redone (step 2):
// params, m, v and every 16-bit copy equal the plain steps', on NVMe (pipelined or not) and
// on the CPU tier.
TEST(OptimizerSwapperSpeculation, CommittedAndRolledBackUpdatesEqualPlainSteps) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  // -1: CPU tier; else pipeline_read | pipeline_write << 1, and 4: the grads in memory.
  for (const int mode : {-1, 0, 3, 4 | 3}) {
    SCOPED_TRACE(mode < 0 ? std::string("cpu") : "nvme mode " + std::to_string(mode));
    const bool in_place = mode < 0 || (mode & 4) != 0;  // the grads array used in place
    TempDir dir;
    NvmeStore store(store_config(dir.path(), true));
    AdamOptimizer adam(adam_config());
    OptimizerSwapperConfig config;
    config.device = mode < 0 ? OffloadDevice::kCpu : OffloadDevice::kNvme;
    config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
    config.pipeline_read = mode > 0 && (mode & 1) != 0;
    config.pipeline_write = mode > 0 && (mode & 2) != 0;
    config.speculate = true;
    config.grads_in_memory = mode > 0 && (mode & 4) != 0;
    OptimizerSwapper swapper(config, adam, &store);
    swapper.initialize(problem.params.data());
    Outcome got;
    const auto sink = [&](uint64_t offset, const void* data, uint64_t numel) {
      got.copies[offset].assign(static_cast<const uint16_t*>(data),
                                static_cast<const uint16_t*>(data) + numel);
    };
    const std::vector<size_t> order = backward_order(swapper);
    for (int step = 1; step <= 2; ++step) {
      const std::vector<float>& grads = problem.grads[static_cast<size_t>(step - 1)];
      if (in_place) swapper.write_grads(0, grads.data(), kNumel);
      // Every sub-group but the first (the last to be final) behind the "backward".
      for (size_t k = 0; k + 1 < order.size(); ++k) {
        const auto [offset, numel] = swapper.sub_group_range(order[k]);
        std::vector<uint16_t> copy(numel);
        bool taken = false;
        (void)swapper.speculate(order[k], in_place ? nullptr : grads.data() + offset,
                                options_for(step), copy.data(), /*keep_grads=*/step == 2,
                                [&] { taken = true; });
        EXPECT_TRUE(taken);
        EXPECT_TRUE(swapper.speculated(order[k]));
        if (step == 1) got.copies[offset] = copy;
      }
      if (!in_place) swapper.write_grads(0, grads.data(), kSubGroup);  // the first sub-group's
      if (step == 1) {
        swapper.commit_speculation();
      } else {
        EXPECT_EQ(swapper.rollback_speculation(), order.size() - 1);
      }
      const OptimizerStepReport report = swapper.step(options_for(step), sink);
      EXPECT_EQ(report.sub_groups, order.size());
      read_arrays(swapper, got);
      const Outcome expected = run_direct(problem, step);
      expect_identical(got, expected, "after step " + std::to_string(step));
      for (const auto& [offset, copy] : expected.copies) {
        EXPECT_EQ(got.copies[offset], copy) << "16-bit copy at " << offset << ", step " << step;
      }
    }
  }
}

// speculate_window: only the last N sub-groups get spare extents (the footprint counts just
// those) and may be speculated; a speculation outside the window is refused; committed window
// updates and the plain update of the rest equal the plain step.
TEST(OptimizerSwapperSpeculation, AWindowOfTheLastSubGroupsHasSparesOnlyThere) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();  // 4
  config.speculate = true;
  config.speculate_window = 2;
  OptimizerSwapperConfig all = config;
  all.speculate_window = 0;
  OptimizerSwapperConfig none = config;
  none.speculate = false;
  const Footprint f = OptimizerSwapper::footprint(config, adam.state_arrays());
  // Spares for p, m, v of sub-groups 2 and 3 (3000 and 1007 elements) only.
  EXPECT_GT(f.nvme, OptimizerSwapper::footprint(none, adam.state_arrays()).nvme);
  EXPECT_LT(f.nvme, OptimizerSwapper::footprint(all, adam.state_arrays()).nvme);
  OptimizerSwapper swapper(config, adam, &store);
  EXPECT_EQ(store.stats().file_bytes, f.nvme);
  EXPECT_FALSE(swapper.can_speculate(0));
  EXPECT_FALSE(swapper.can_speculate(1));
  EXPECT_TRUE(swapper.can_speculate(2));
  EXPECT_TRUE(swapper.can_speculate(3));
  swapper.initialize(problem.params.data());
  const std::vector<float>& grads = problem.grads[0];
  std::vector<uint16_t> copy(kSubGroup);
  try {
    (void)swapper.speculate(1, grads.data() + kSubGroup, options_for(1), copy.data(), false, {});
    ADD_FAILURE() << "a sub-group outside the window was speculated";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  }
  Outcome got;
  for (const size_t g : {size_t{3}, size_t{2}}) {
    const auto [offset, numel] = swapper.sub_group_range(g);
    std::vector<uint16_t> c(numel);
    (void)swapper.speculate(g, grads.data() + offset, options_for(1), c.data(), false, {});
    got.copies[offset] = c;
  }
  swapper.write_grads(0, grads.data(), 2 * kSubGroup);  // sub-groups 0 and 1
  swapper.commit_speculation();
  (void)swapper.step(options_for(1), [&](uint64_t offset, const void* data, uint64_t numel) {
    got.copies[offset].assign(static_cast<const uint16_t*>(data),
                              static_cast<const uint16_t*>(data) + numel);
  });
  read_arrays(swapper, got);
  expect_identical(got, run_direct(problem, 1), "window of 2");
}

// A failed write of a speculated update: reported, and nothing committed is lost — the
// partition reads as before the step, and the plain step from it gives the plain result.
TEST(OptimizerSwapperSpeculation, FailedSpeculativeWriteLosesNothingCommitted) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  const Problem problem(seed);
  TempDir dir;
  auto faults = std::make_shared<aio::FaultInjector>();
  NvmeStoreConfig store_cfg = store_config(dir.path(), true);
  store_cfg.backend_factory = aio::fault_backend_factory(faults);
  NvmeStore store(store_cfg);
  AdamOptimizer adam(adam_config());
  OptimizerSwapperConfig config;
  config.sub_groups = cut_sub_groups(kNumel, kSubGroup).sizes();
  config.speculate = true;
  OptimizerSwapper swapper(config, adam, &store);
  swapper.initialize(problem.params.data());
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .nth = 2,
                             .count = 1,
                             .kind = aio::FaultKind::kError,
                             .error = ENOSPC});
  bool reported = false;
  try {
    for (const size_t g : backward_order(swapper)) {
      const auto [offset, numel] = swapper.sub_group_range(g);
      std::vector<uint16_t> copy(numel);
      (void)swapper.speculate(g, problem.grads[0].data() + offset, options_for(1), copy.data(),
                              false, {});
    }
    swapper.commit_speculation();
  } catch (const OffloadError& e) {
    reported = true;
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  EXPECT_TRUE(reported) << "the failed speculative write was not reported";
  EXPECT_EQ(faults->fired(0), 1u);
  (void)swapper.rollback_speculation();
  faults->clear();
  Outcome before;
  read_arrays(swapper, before);
  EXPECT_EQ(std::memcmp(before.params.data(), problem.params.data(), kNumel * 4), 0)
      << "the committed params were changed";
  EXPECT_TRUE(
      std::all_of(before.exp_avg.begin(), before.exp_avg.end(), [](float m) { return m == 0.0f; }));
  swapper.write_grads(0, problem.grads[0].data(), kNumel);
  Outcome after;
  (void)swapper.step(options_for(1), [&](uint64_t offset, const void* data, uint64_t numel) {
    after.copies[offset].assign(static_cast<const uint16_t*>(data),
                                static_cast<const uint16_t*>(data) + numel);
  });
  read_arrays(swapper, after);
  expect_identical(after, run_direct(problem, 1), "the plain step after the failure");
}

}  // namespace
}  // namespace zinf::offload
