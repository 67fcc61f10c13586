// The memory plan against what a run really allocates: pinned pools and staging buffers,
// swap file bytes, resident device bytes and the optimizer's host arrays must equal the
// plan's figures, for several offload choices.

#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/multi_process.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_accelerator.h"
#include "zero/comm/launch_env.h"

namespace zinf::engine {
namespace {

TEST(MemoryPlan, MatchesWhatTheRunAllocates) {
  ::zinf::testing::TempDir dir;
  struct Variant {
    int stage;
    zero::OffloadTarget param, optimizer;
    bool tied = false;  // the embedding and the head one matrix (a pinned buffer parks its
                        // gradient between the two: zero/tied_grads.h)
  };
  for (const Variant& v :
       {Variant{0, zero::OffloadTarget::kNone, zero::OffloadTarget::kNone},
        Variant{2, zero::OffloadTarget::kNone, zero::OffloadTarget::kCpu, true},
        Variant{3, zero::OffloadTarget::kCpu, zero::OffloadTarget::kCpu},
        Variant{3, zero::OffloadTarget::kNvme, zero::OffloadTarget::kNvme, true}}) {
    SCOPED_TRACE("stage " + std::to_string(v.stage) + (v.tied ? ", tied" : ""));
    EngineOptions o;
    o.zero.stage = v.stage;
    o.zero.offload_param = v.param;
    o.zero.offload_optimizer = v.optimizer;
    o.zero.nvme_paths = {dir.path()};
    o.zero.sub_group_size = 7000;
    o.zero.param_buffer_size = 5000;
    o.zero.param_max_in_cpu = 3000;
    o.zero.pipeline_read = true;
    o.zero.aio.backend = aio::BackendKind::kPsync;
    o.steps_per_print = 0;
    o.memory_budget = 1ull << 30;
    o.accelerator = ::zinf::testing::test_accelerator();
    LlamaConfig c = *named_llama("tiny", 64);
    c.tie_embeddings = v.tied;
    auto model = std::make_shared<LlamaModelImpl>(c);
    Engine engine(model, o,
                  [](const std::string& name, at::Tensor& full) { init_parameter(1, name, full); });
    const MemoryReport r = engine.memory_report();
    EXPECT_EQ(r.pinned, r.plan.pinned);
    EXPECT_EQ(r.nvme, r.plan.nvme);
    EXPECT_EQ(engine.zero_model().stats().resident_bytes, r.plan.device_resident);
    if (v.optimizer == zero::OffloadTarget::kCpu) {
      EXPECT_EQ(r.host, r.plan.host);
    }
    EXPECT_EQ(r.plan.model_numel, static_cast<uint64_t>(c.parameter_count()));
  }
}

// A stage-3 run with parameters offloaded: what the accelerator, the pinned pools, the host
// and the swap files held at their peak during real training steps must not exceed the plan,
// and the plan must not be far above it: at most 1.5x the measured figure + 64 KiB. The plan
// is an upper bound over every trace position and every order in which copies and
// all-gathers complete (the prefetch window and, with several ranks, the slices of a block's
// all-gathers in flight counted in full), the measured peak is one run's; 1.5x leaves room
// for that and still catches a term counted twice or a window counted per block instead of
// per bucket; the 64 KiB covers page rounding and a few small parameters on models this
// small. Runs variant `only` (all when negative) at this world size (the launch variables).
constexpr int kPlanVariants = 6;

void expect_peaks_within_plan(int only) {
  ::zinf::testing::TempDir dir;
  LlamaConfig c = *named_llama("tiny", 64);
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_layers = 3;
  uint64_t layer_numel = 0;
  for (const auto& s : llama_parameter_shapes(c)) {
    if (s.name.rfind("model.layers.0.", 0) == 0) layer_numel += static_cast<uint64_t>(s.numel);
  }
  struct Variant {
    zero::OffloadTarget param, optimizer;
    uint64_t max_live, prefetch_bucket, persistence;
    uint64_t param_buffer;  // offload_param.buffer_size (4 buffers)
  };
  const uint64_t h = static_cast<uint64_t>(c.hidden_size);
  const uint64_t largest = h * static_cast<uint64_t>(c.intermediate_size);  // an MLP weight
  const uint64_t default_bucket = zero::ZeroConfig{}.prefetch_bucket_size;
  const Variant variants[] = {
      // The bare `zinf train` shape: one layer live, 0.9 x hidden^2 prefetch buckets.
      {zero::OffloadTarget::kNvme, zero::OffloadTarget::kNvme, layer_numel, h * h * 9 / 10, 10 * h,
       layer_numel},
      {zero::OffloadTarget::kCpu, zero::OffloadTarget::kCpu, layer_numel, h * h * 9 / 10, 10 * h,
       layer_numel},
      {zero::OffloadTarget::kCpu, zero::OffloadTarget::kNvme, 1'000'000'000, 2 * h * h, 0,
       layer_numel},
      {zero::OffloadTarget::kNvme, zero::OffloadTarget::kCpu, 2 * layer_numel, h * h / 2, h,
       layer_numel},
      // DeepSpeed's default prefetch bucket (5e7 elements): the copy window covers the whole
      // model, far more than the param pool lets reads run ahead (4 buffers of the largest
      // parameter, one kept for the slice needed at once: 3 parameters, under a layer). A
      // copy forces its read (zero/param_store.cc start_copy) and keeps its device buffer
      // until the parameter is released, so the device holds every copy of the window: a
      // plan bounded by the pool would be below the measured peak.
      {zero::OffloadTarget::kNvme, zero::OffloadTarget::kNvme, layer_numel, default_bucket, 10 * h,
       largest},
      {zero::OffloadTarget::kCpu, zero::OffloadTarget::kCpu, layer_numel, default_bucket, 10 * h,
       largest}};
  static_assert(std::extent_v<decltype(variants)> == kPlanVariants);
  for (int i = 0; i < static_cast<int>(std::size(variants)); ++i) {
    if (only >= 0 && i != only) continue;
    const Variant& v = variants[i];
    SCOPED_TRACE(::testing::Message() << "param " << static_cast<int>(v.param) << " optimizer "
                                      << static_cast<int>(v.optimizer) << " live " << v.max_live
                                      << " prefetch " << v.prefetch_bucket << " persistence "
                                      << v.persistence << " buffer " << v.param_buffer);
    EngineOptions o;
    o.zero.stage = 3;
    o.zero.offload_param = v.param;
    o.zero.offload_optimizer = v.optimizer;
    o.zero.nvme_paths = {dir.path()};
    o.zero.max_live_parameters = v.max_live;
    o.zero.prefetch_bucket_size = v.prefetch_bucket;
    o.zero.param_persistence_threshold = v.persistence;
    o.zero.reduce_bucket_size = h * h;
    o.zero.param_buffer_count = 4;
    o.zero.param_buffer_size = v.param_buffer;
    o.zero.param_max_in_cpu = 0;
    o.zero.gradient_accumulation_steps = 2;
    o.zero.aio.backend = aio::BackendKind::kPsync;
    o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
    o.optimizer.lr = 1e-3;
    o.micro_batch_size = 2;
    o.steps_per_print = 0;
    o.memory_budget = 1ull << 30;
    o.accelerator = ::zinf::testing::test_accelerator();
    o.launch = zero::detect_launch_env();
    auto model = std::make_shared<LlamaModelImpl>(c);
    Engine engine(model, o,
                  [](const std::string& name, at::Tensor& full) { init_parameter(3, name, full); });
    at::manual_seed(11 + engine.rank());
    for (int step = 0; step < 3; ++step) {
      (void)engine.train_batch([&](int) {
        const at::Tensor seq = at::randint(c.vocab_size, {2, 17}, at::kLong);
        return model->loss(seq.narrow(1, 0, 16), seq.narrow(1, 1, 16));
      });
    }
    const MemoryReport r = engine.memory_report();
    const std::pair<uint64_t, uint64_t> tiers[] = {
        {r.device_peak, r.plan.device_total() - r.plan.device_activations},
        {r.pinned, r.plan.pinned},
        {r.host, r.plan.host},
        {r.nvme, r.plan.nvme}};
    const char* const names[] = {"device", "pinned", "host", "nvme"};
    for (size_t t = 0; t < 4; ++t) {
      const auto [measured, planned] = tiers[t];
      EXPECT_LE(measured, planned) << names[t] << " (rank " << engine.rank() << ")\n" << r.table();
      EXPECT_LE(planned, measured * 3 / 2 + (64u << 10))
          << names[t] << " (rank " << engine.rank() << ")\n"
          << r.table();
    }
  }
}

TEST(MemoryPlan, MeasuredPeaksStayWithinThePlanAtStage3) { expect_peaks_within_plan(-1); }

// Run by TwoRanksMeasuredPeaksStayWithinThePlanAtStage3 in each rank, one variant per launch
// (an engine's rendezvous store cannot be reused at once by the next engine on its port).
TEST(MemoryPlanChild, DISABLED_PeaksWithinPlan) {
  const char* variant = std::getenv("ZINF_TEST_PLAN_VARIANT");
  ASSERT_NE(variant, nullptr);
  expect_peaks_within_plan(std::atoi(variant));
}

TEST(MemoryPlan, TwoRanksMeasuredPeaksStayWithinThePlanAtStage3) {
  if (::zinf::testing::is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  for (int variant = 0; variant < kPlanVariants; ++variant) {
    ::zinf::testing::RanksOptions o;
    o.world_size = 2;
    o.test = "MemoryPlanChild.DISABLED_PeaksWithinPlan";
    o.deadline = std::chrono::seconds(120);
    o.env.emplace_back("OMP_NUM_THREADS", "1");  // two ranks share the machine's cores
    o.env.emplace_back("ZINF_TEST_PLAN_VARIANT", std::to_string(variant));
    for (const ::zinf::testing::RankResult& r : ::zinf::testing::run_ranks(o)) {
      EXPECT_TRUE(::zinf::testing::rank_passed(r)) << "variant " << variant;
    }
  }
}

// Activation offload: after real steps its pinned buffers and swap extents are exactly what
// the plan counts for it, the other tiers stay within the plan, and LibTorch's measured peak on
// the device stays under the plan's activations and falls when the saved inputs leave it.
TEST(MemoryPlan, ActivationOffloadKeepsWhatThePlanCounts) {
  ::zinf::testing::TempDir dir;
  LlamaConfig c = *named_llama("tiny", 64);
  c.num_layers = 12;
  constexpr int64_t kBatch = 2, kSeq = 64;
  std::map<zero::OffloadTarget, uint64_t> compute_peak;
  for (zero::OffloadTarget tier :
       {zero::OffloadTarget::kNone, zero::OffloadTarget::kCpu, zero::OffloadTarget::kNvme}) {
    SCOPED_TRACE(::testing::Message() << "activation_offload " << static_cast<int>(tier));
    EngineOptions o;
    o.zero.stage = 3;
    o.zero.activation_offload = tier;
    o.zero.nvme_paths = {dir.path()};
    o.zero.aio.backend = aio::BackendKind::kPsync;
    o.micro_batch_size = kBatch;
    o.activations = llama_activations(c, kBatch, kSeq, 4);
    o.steps_per_print = 0;
    o.memory_budget = 1ull << 30;
    o.accelerator = ::zinf::testing::test_accelerator();
    auto model = std::make_shared<LlamaModelImpl>(c);
    Engine engine(model, o,
                  [](const std::string& name, at::Tensor& full) { init_parameter(5, name, full); });
    at::manual_seed(5);
    for (int step = 0; step < 2; ++step) {
      (void)engine.train_batch([&](int) {
        const at::Tensor seq = at::randint(c.vocab_size, {kBatch, kSeq + 1}, at::kLong);
        return model->loss(seq.narrow(1, 0, kSeq), seq.narrow(1, 1, kSeq));
      });
    }
    const MemoryReport r = engine.memory_report();
    EXPECT_EQ(r.activations.pinned_bytes, r.plan.pinned_activations) << r.table();
    EXPECT_EQ(r.activations.nvme_bytes, r.plan.nvme_activations) << r.table();
    EXPECT_EQ(r.activations.saved, tier == zero::OffloadTarget::kNone ? 0u : 24u);
    EXPECT_LE(r.pinned, r.plan.pinned) << r.table();
    EXPECT_LE(r.nvme, r.plan.nvme) << r.table();
    ASSERT_TRUE(r.compute.measured);
    EXPECT_LE(r.compute.peak_bytes, r.plan.device_activations) << r.table();
    compute_peak[tier] = r.compute.peak_bytes;
  }
  // Twelve saved inputs of 2 x 64 x hidden fp32 left the device and one at a time comes back
  // for its backward: the peak falls by eleven of them (measured on LibTorch 1.13 and 2.11),
  // at least ten here.
  const uint64_t saved = 10 * kBatch * kSeq * static_cast<uint64_t>(c.hidden_size) * 4;
  EXPECT_LE(compute_peak[zero::OffloadTarget::kCpu] + saved,
            compute_peak[zero::OffloadTarget::kNone]);
  EXPECT_LE(compute_peak[zero::OffloadTarget::kNvme] + saved,
            compute_peak[zero::OffloadTarget::kNone]);
}

TEST(MemoryPlan, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(4095), "4095 B");
  EXPECT_EQ(format_bytes(12 * 1024), "12.00 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

}  // namespace
}  // namespace zinf::engine
