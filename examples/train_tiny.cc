// train_tiny: the smallest complete program over zinf's engine API. It builds the tiny
// Llama-style reference model, hands it to an Engine running ZeRO stage 3 on the CPU
// accelerator with the optimizer states offloaded to CPU memory, and trains it for a few
// steps on byte-level text (each byte a token, vocabulary 256), printing the loss.
//
//   train_tiny [steps]     (default 10)
//
// Built against an installed zinf by examples/CMakeLists.txt (find_package(zinf)). Under
// torchrun each process becomes one rank: the launch environment is read from the usual
// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...).
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "zero/comm/launch_env.h"

namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kSeqLen = 64;     // tokens per sample
constexpr int64_t kMicroBatch = 4;  // samples per rank per step

// The training text. Any bytes will do; a repetitive text shows the loss falling quickly.
constexpr std::string_view kText =
    "The engine keeps each parameter in one place and gathers it only while its layer runs. "
    "The optimizer states live in CPU memory or on NVMe and are streamed in for the update. "
    "A model larger than the accelerator's memory trains this way, one layer at a time. "
    "The loss printed below is the mean cross-entropy of predicting the next byte. ";

// `count` windows of kSeqLen + 1 bytes at random offsets: inputs are the first kSeqLen bytes,
// targets the same window shifted by one.
std::pair<at::Tensor, at::Tensor> sample_batch(std::mt19937_64& rng, int64_t count) {
  std::uniform_int_distribution<size_t> offset(0, kText.size() - kSeqLen - 2);
  std::vector<int64_t> tokens;
  tokens.reserve(static_cast<size_t>(count * (kSeqLen + 1)));
  for (int64_t i = 0; i < count; ++i) {
    const size_t start = offset(rng);
    for (int64_t t = 0; t <= kSeqLen; ++t) {
      tokens.push_back(static_cast<unsigned char>(kText[start + static_cast<size_t>(t)]));
    }
  }
  const at::Tensor window = at::tensor(tokens, at::kLong).view({count, kSeqLen + 1});
  return {window.narrow(1, 0, kSeqLen), window.narrow(1, 1, kSeqLen)};
}

int run(int steps) {
  namespace engine = zinf::engine;

  // The model: named shape "tiny" (2 layers, hidden 64), byte vocabulary. Its parameters
  // are allocated here but written by the Engine (init_parameter below), partition by
  // partition, so the same code builds models larger than memory.
  engine::LlamaConfig config = *engine::named_llama("tiny", /*vocab_size=*/256);
  config.max_seq_len = kSeqLen;
  auto model = std::make_shared<engine::LlamaModelImpl>(config);

  // What a DeepSpeed config would say: stage 3, AdamW, optimizer states on the CPU.
  engine::EngineOptions options;
  options.zero.stage = 3;
  options.zero.offload_optimizer = zinf::zero::OffloadTarget::kCpu;
  options.optimizer.type = zinf::optimizer_cpu::OptimizerKind::kAdamW;
  options.optimizer.lr = 3e-3;
  options.optimizer.weight_decay = 0.01;
  options.micro_batch_size = kMicroBatch;
  options.tokens_per_sample = kSeqLen;
  options.steps_per_print = 0;  // this program prints its own line per step
  options.accelerator = "cpu";
  options.memory_budget = 256ull << 20;  // bytes the CPU accelerator may hand out
  options.activations =                  // for the memory plan: fp32 activations of one micro-batch
      engine::llama_activations(config, kMicroBatch, kSeqLen, sizeof(float));
  options.launch = zinf::zero::detect_launch_env();

  engine::Engine trainer(model, options, [](const std::string& name, at::Tensor& full) {
    engine::init_parameter(kSeed, name, full);
  });
  if (trainer.rank() == 0) {
    std::printf("train_tiny: %lld parameters, %d rank(s), %d steps\n",
                static_cast<long long>(config.parameter_count()), trainer.world_size(), steps);
  }

  std::mt19937_64 rng(kSeed + static_cast<uint64_t>(trainer.rank()));  // each rank its data
  for (int step = 0; step < steps; ++step) {
    // One optimizer step: forward, backward and the update (ZeRO gathers and frees each
    // layer's parameters as it runs). The loss reported is the mean over all ranks.
    const engine::StepReport report = trainer.train_batch([&](int /*micro_batch*/) {
      auto [inputs, targets] = sample_batch(rng, kMicroBatch);
      return model->loss(inputs, targets);
    });
    if (trainer.rank() == 0) {
      std::printf("step %lld loss %.4f lr %.2e tokens/s %.0f\n",
                  static_cast<long long>(report.global_step), report.loss, report.lr,
                  report.tokens_per_second);
    }
  }
  if (trainer.rank() == 0) {
    std::fputs(trainer.memory_report().table().c_str(), stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int steps = argc > 1 ? std::stoi(argv[1]) : 10;
    if (steps < 1) {
      std::fprintf(stderr, "usage: %s [steps >= 1]\n", argv[0]);
      return 2;
    }
    return run(steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_tiny: %s\n", e.what());
    return 1;
  }
}
