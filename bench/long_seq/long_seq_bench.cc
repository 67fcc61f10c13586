// bench/long_seq: what long sequences cost in memory, with and without the long-sequence
// kernels (engine/model/attention.h: attention without the [seq, seq] score matrix;
// engine/model/lm_loss.h: the head and the loss without the [tokens, vocab] logits) and with
// and without activation offload (zero/activation_offload.h: the blocks' saved inputs in
// pinned memory or on NVMe). One training step (forward, backward with ZeroBlock
// recomputation, optimizer step) of a SmolLM-135M-shaped model (hidden 576, intermediate
// 1536, 9 heads with 3 key/value heads, vocabulary 49152, tied embeddings; --layers of its 30,
// default 4) through the Engine at stage 3 on the CPU accelerator, one sample of --seq tokens.
// Each (sequence, variant) runs in a child process of this program. Variants (--variants):
//   plain  both thresholds raised past any size (the whole score matrix and the whole logits)
//   long   the defaults
//   cpu    long, and zinf.activation_offload "cpu"
//   nvme   long, and zinf.activation_offload "nvme" (a swap folder made under --nvme-path)
// The child trains one step (which allocates the optimizer states and buffers every step
// reuses), resets its peaks (/proc/self/clear_refs; engine/compute_memory.h) and measures the
// second step. Printed: that step's device peak (LibTorch's allocations on the compute device:
// on the CPU accelerator, through the counting allocator), its peak RSS and growth over the RSS
// before it, its seconds, the loss, and ratios: long/plain, and each offload variant against
// long.
//
//   build/bench/long_seq/zinf_long_seq_bench [--seq 1024,2048,4096] [--layers 4] [--threads 2]
//       [--variants plain,long,cpu,nvme] [--nvme-path DIR]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "aio/pinned_budget.h"
#include "engine/compute_memory.h"
#include "engine/engine.h"
#include "engine/model/attention.h"
#include "engine/model/llama.h"
#include "engine/model/lm_loss.h"

namespace {

using namespace zinf;

struct Args {
  std::vector<int64_t> seqs = {1024, 2048, 4096};
  int64_t layers = 4;
  int threads = 2;
  std::vector<std::string> variants = {"plain", "long"};
  std::string nvme_path = "/tmp";
  std::string child;  // internal: "VARIANT:SEQ"
};

// This process's resident set now (VmRSS), in bytes.
uint64_t rss_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

engine::LlamaConfig smollm(int64_t layers, int64_t seq) {
  engine::LlamaConfig c;
  c.name = "smollm-135m-shaped";
  c.hidden_size = 576, c.intermediate_size = 1536, c.num_layers = layers;
  c.num_heads = 9, c.num_kv_heads = 3, c.vocab_size = 49152, c.tie_embeddings = true;
  c.max_seq_len = seq, c.rms_norm_eps = 1e-5, c.rope_theta = 10000.0;
  return c;
}

// One step in this process: prints
// "RESULT variant seq peak_rss rss_before device_peak seconds loss".
int run_child(const Args& a) {
  const size_t colon = a.child.find(':');
  const std::string variant = a.child.substr(0, colon);
  const int64_t seq = std::stoll(a.child.substr(colon + 1));
  if (variant == "plain") {
    engine::set_full_scores_limit(std::numeric_limits<uint64_t>::max());
    engine::set_full_logits_limit(std::numeric_limits<uint64_t>::max());
  }
  at::set_num_threads(a.threads);
  const engine::LlamaConfig c = smollm(a.layers, seq);
  auto model = std::make_shared<engine::LlamaModelImpl>(c);
  engine::EngineOptions o;
  o.zero.stage = 3;
  o.steps_per_print = 0;
  o.memory_budget = 4ull << 30;
  std::string swap;
  if (variant == "cpu") o.zero.activation_offload = zero::OffloadTarget::kCpu;
  if (variant == "nvme") {
    std::string pattern = a.nvme_path + "/zinf-long-seq-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      fmt::print(stderr, "cannot make a swap folder under {}\n", a.nvme_path);
      return 1;
    }
    swap = pattern;
    o.zero.activation_offload = zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {swap};
  }
  int rc = 0;
  {
    engine::Engine eng(model, o, [](const std::string& name, at::Tensor& full) {
      engine::init_parameter(7, name, full);
    });
    // The same tokens in every child: a generator of their own.
    at::Generator generator = at::detail::createCPUGenerator(1234);
    const at::Tensor tokens = at::randint(0, c.vocab_size, {1, seq + 1}, generator, at::kLong);
    const at::Tensor x = tokens.narrow(1, 0, seq).contiguous();
    const at::Tensor y = tokens.narrow(1, 1, seq).contiguous();
    // A first step allocates what every step reuses (optimizer states, gradient buffers,
    // offload buffers); the peaks are then reset and the second step's own measured.
    (void)eng.train_batch([&](int) { return model->loss(x, y); });
    if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
      std::fputs("5", f);
      std::fclose(f);
    }
    const c10::Device device = eng.device();
    engine::reset_compute_peak(device);
    const uint64_t before = rss_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    const engine::StepReport r = eng.train_batch([&](int) { return model->loss(x, y); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const engine::ComputeMemory compute = engine::compute_memory(device);
    if (!compute.measured) rc = 1;
    fmt::print("RESULT {} {} {} {} {} {:.3f} {:.6f}\n", variant, seq, aio::peak_rss_bytes(), before,
               compute.peak_bytes, seconds, r.loss);
  }
  if (!swap.empty()) std::filesystem::remove_all(swap);
  return rc;
}

struct Result {
  uint64_t peak = 0, before = 0, device = 0;
  double seconds = 0, loss = 0;
  bool ok = false;
};

Result run_variant(const std::string& self, const Args& a, const std::string& variant,
                   int64_t seq) {
  const std::string cmd =
      fmt::format("'{}' --child {}:{} --layers {} --threads {} --nvme-path '{}'", self, variant,
                  seq, a.layers, a.threads, a.nvme_path);
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r;
  if (p == nullptr) return r;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    char name[32];
    long long s = 0;
    unsigned long long peak = 0, before = 0, device = 0;
    if (std::sscanf(line, "RESULT %31s %lld %llu %llu %llu %lf %lf", name, &s, &peak, &before,
                    &device, &r.seconds, &r.loss) == 7) {
      r.peak = peak, r.before = before, r.device = device, r.ok = true;
    }
  }
  if (::pclose(p) != 0) r.ok = false;
  return r;
}

double mib(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

// What the step added to the resident set (0 when the peak came before it).
uint64_t growth(const Result& r) { return r.peak > r.before ? r.peak - r.before : 0; }

// "0.46x"; "n/a" when the base is under 1 MiB (a step whose RSS did not grow past the RSS
// before it has no meaningful growth to compare with).
std::string ratio(uint64_t a, uint64_t b) {
  if (b < (1u << 20)) return "n/a";
  return fmt::format("{:.2f}x", static_cast<double>(a) / static_cast<double>(b));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Peak memory of one training step at long sequences: zinf's long-sequence attention and "
      "loss against the plain ones, and activation offload against none"};
  Args a;
  app.add_option("--seq", a.seqs, "Sequence lengths")->delimiter(',');
  app.add_option("--layers", a.layers, "Decoder layers (SmolLM-135M has 30)");
  app.add_option("--threads", a.threads, "Compute threads");
  app.add_option("--variants", a.variants, "Of plain, long, cpu, nvme (see the source's header)")
      ->delimiter(',')
      ->check(CLI::IsMember({"plain", "long", "cpu", "nvme"}));
  app.add_option("--nvme-path", a.nvme_path, "Where the nvme variant makes its swap folder");
  app.add_option("--child", a.child)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!a.child.empty()) return run_child(a);

  fmt::print(
      "one training step (stage 3, fp32, CPU accelerator) of a SmolLM-135M-shaped model with {} "
      "layers, batch 1; plain: the whole score matrix and logits; long: zinf's chunked "
      "attention and loss{}; cpu/nvme: long with the blocks' saved inputs offloaded there\n",
      a.layers,
#if TORCH_VERSION_MAJOR >= 2
      " (scaled_dot_product_attention for the causal layers)"
#else
      ""
#endif
  );
  fmt::print("{:>6} {:>8} {:>16} {:>14} {:>16} {:>10} {:>12}\n", "seq", "variant",
             "device peak MiB", "peak RSS MiB", "step growth MiB", "s/step", "loss");
  int failures = 0;
  for (int64_t seq : a.seqs) {
    std::map<std::string, Result> results;
    for (const std::string& v : a.variants) {
      const Result r = run_variant(argv[0], a, v, seq);
      if (!r.ok) {
        fmt::print("{:>6} {:>8} failed\n", seq, v);
        ++failures;
        continue;
      }
      results[v] = r;
      fmt::print("{:>6} {:>8} {:>16.1f} {:>14.1f} {:>16.1f} {:>10.2f} {:>12.6f}\n", seq, v,
                 mib(r.device), mib(r.peak), mib(growth(r)), r.seconds, r.loss);
    }
    auto compare = [&](const std::string& x, const std::string& base) {
      if (!results.count(x) || !results.count(base)) return;
      const Result& r = results[x];
      const Result& b = results[base];
      fmt::print(
          "{:>6} {}/{}: device peak {}, peak RSS {}, step growth {}, time {:.2f}x, "
          "loss difference {:.2e}\n",
          seq, x, base, ratio(r.device, b.device), ratio(r.peak, b.peak),
          ratio(growth(r), growth(b)), r.seconds / b.seconds, r.loss - b.loss);
    };
    compare("long", "plain");
    compare("cpu", "long");
    compare("nvme", "long");
  }
  return failures == 0 ? 0 : 1;
}
