// A tied matrix's gradient between its uses (zero/tied_grads.h): ZeroModel::backward takes
// the output head's contribution off the device until the embedding's arrives, delivering
// the sum autograd would have formed. Measured with LibTorch's own allocations
// (engine/compute_memory.h) against a plain backward of the same model.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/compute_memory.h"
#include "offload/cpu_accelerator.h"
#include "optimizer_cpu/adam.h"
#include "tests/common/seed.h"
#include "zero/comm/single_communicator.h"
#include "zero/zero_block.h"
#include "zero/zero_model.h"

namespace zinf::engine {
namespace {

constexpr int64_t kVocab = 8192, kDim = 128, kInner = 16384, kTokens = 256;

// A wide residual MLP: its recomputation and backward hold far more than the tied matrix.
struct WideImpl : torch::nn::Module {
  WideImpl() {
    up = register_module("up", torch::nn::Linear(kDim, kInner));
    down = register_module("down", torch::nn::Linear(kInner, kDim));
  }
  at::Tensor forward(const at::Tensor& x) { return x + down(at::tanh(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Wide);

struct TableImpl : torch::nn::Module {
  explicit TableImpl(at::Tensor shared) { weight = register_parameter("weight", shared); }
  at::Tensor weight;
};
TORCH_MODULE(Table);

// One [vocab, dim] matrix under two names outside the blocks: looked up for the input
// ("embed") and multiplied for the logits ("head"), as a tied language model uses it.
struct TiedLmImpl : torch::nn::Module {
  TiedLmImpl() {
    embed = register_module("embed", Table(at::randn({kVocab, kDim}) * 0.02));
    list = register_module("layers", torch::nn::ModuleList());
    for (int b = 0; b < 2; ++b) {
      layers.push_back(zero::ZeroBlock(Wide()));
      list->push_back(layers.back());
    }
    head = register_module("head", Table(embed->weight));
  }
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor x = at::embedding(embed->weight, tokens);
    for (auto& layer : layers) x = layer(x);
    return at::cross_entropy_loss(at::matmul(x, head->weight.t()), targets);
  }
  Table embed{nullptr};
  torch::nn::ModuleList list{nullptr};
  std::vector<zero::ZeroBlock> layers;
  Table head{nullptr};
};
TORCH_MODULE(TiedLm);

struct TiedRun {
  std::vector<at::Tensor> master;
  std::vector<double> losses;
  uint64_t peak = 0;  // LibTorch's CPU bytes at the peak of the last backward, over its start
  zero::ZeroModelStats stats;
};

// Two steps of two micro-batches; `routed`: ZeroModel::backward, else a plain backward.
TiedRun train(int stage, bool routed, uint64_t seed) {
  track_compute_memory();
  at::manual_seed(seed);
  TiedLm net;
  offload::CpuAccelerator accelerator(1ull << 30);
  zero::SingleCommunicator comm;
  optimizer_cpu::AdamOptimizer adam;
  zero::ZeroConfig config;
  config.stage = stage;
  config.gradient_accumulation_steps = 2;
  zero::ZeroModel model(*net, config, accelerator, comm, adam);
  TiedRun run;
  for (int step = 0; step < 2; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      at::manual_seed(seed * 31 + static_cast<uint64_t>(step * 2 + mb));
      const at::Tensor tokens = at::randint(kVocab, {kTokens}, at::kLong);
      const at::Tensor targets = at::randint(kVocab, {kTokens}, at::kLong);
      model.begin_micro_batch(mb);
      const at::Tensor loss = net->loss(tokens, targets);
      run.losses.push_back(loss.item<double>());
      reset_compute_peak(at::kCPU);
      const uint64_t before = compute_memory(at::kCPU).in_use_bytes;
      if (routed) {
        model.backward(loss / 2);
      } else {
        (loss / 2).backward();
      }
      run.peak = compute_memory(at::kCPU).peak_bytes - before;
      model.end_micro_batch();
    }
    (void)model.step(step + 1, 1.0);
  }
  run.master = model.gather_master();
  run.stats = model.stats();
  return run;
}

TEST(TiedGradients, TheHeadsContributionWaitsInPinnedMemoryAndTheSumIsAutograds) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  const uint64_t matrix = static_cast<uint64_t>(kVocab * kDim) * 4;
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const TiedRun plain = train(stage, false, seed);
    const TiedRun routed = train(stage, true, seed);
    EXPECT_EQ(routed.losses, plain.losses);
    ASSERT_EQ(routed.master.size(), plain.master.size());
    for (size_t i = 0; i < plain.master.size(); ++i) {
      ASSERT_TRUE(plain.master[i].defined());
      EXPECT_TRUE(at::equal(routed.master[i], plain.master[i])) << "parameter " << i;
    }
    // One parked contribution (the head's) and one delivered sum per micro-batch; none
    // without the routes. The pinned buffer is there either way.
    EXPECT_EQ(routed.stats.tied.parked, 4u);
    EXPECT_EQ(routed.stats.tied.parked_bytes, 4 * matrix);
    EXPECT_EQ(routed.stats.tied.delivered, 4u);
    EXPECT_EQ(plain.stats.tied.parked, 0u);
    EXPECT_EQ(routed.stats.pinned_bytes, plain.stats.pinned_bytes);
    std::printf("stage %d: backward peak %.2f MiB plain, %.2f MiB routed (the matrix: %.2f MiB)\n",
                stage, static_cast<double>(plain.peak) / (1 << 20),
                static_cast<double>(routed.peak) / (1 << 20),
                static_cast<double>(matrix) / (1 << 20));
    // The blocks' backward is the peak; without the routes the head's gradient is held
    // through it.
    EXPECT_GE(plain.peak, routed.peak + matrix * 9 / 10)
        << "plain " << plain.peak << " B, routed " << routed.peak << " B";
  }
}

}  // namespace
}  // namespace zinf::engine
