// zinf_optimizer_bench: one Adam step over N fp32 params (default 64M) at T threads
// (default 2), timed for zinf's CPU Adam (fp32, and with the bf16 copy-out) and for
// LibTorch's torch::optim::Adam on the same data, against the memory bandwidth of a
// STREAM-triad-like loop measured in the same run at the same thread count.
//
//   zinf_optimizer_bench [--numel N] [--threads T] [--steps S] [--warmup W]
//
// Traffic counted per param: Adam reads p, g, m, v and writes p, m, v (7 x 4 = 28 bytes),
// + 2 with the bf16 copy; the triad a = b + s*c counts 12 bytes per float, as STREAM does.
// Times are the median of S steps after W warm-up steps.
#include <ATen/Parallel.h>
#include <emmintrin.h>
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/simd_level.h"

namespace zinf::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace opt = zinf::optimizer_cpu;

struct Options {
  std::size_t numel = std::size_t{64} << 20;
  int threads = 2;
  int steps = 5;
  int warmup = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + ": missing value");
      return argv[++i];
    };
    if (arg == "--numel") {
      o.numel = std::stoull(value());
    } else if (arg == "--threads") {
      o.threads = std::stoi(value());
    } else if (arg == "--steps") {
      o.steps = std::stoi(value());
    } else if (arg == "--warmup") {
      o.warmup = std::stoi(value());
    } else {
      throw std::invalid_argument("unknown argument " + arg +
                                  " (use --numel, --threads, --steps, --warmup)");
    }
  }
  if (o.numel == 0 || o.threads < 1 || o.steps < 1 || o.warmup < 0) {
    throw std::invalid_argument("--numel, --threads and --steps must be > 0");
  }
  return o;
}

// 2 MiB-aligned array on transparent huge pages where the kernel allows it.
template <class T>
struct HugeArray {
  explicit HugeArray(std::size_t n) : numel(n) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = (n * sizeof(T) + kHuge - 1) / kHuge * kHuge;
    data = static_cast<T*>(std::aligned_alloc(kHuge, bytes));
    if (data == nullptr) throw std::bad_alloc();
    (void)madvise(data, bytes, MADV_HUGEPAGE);
  }
  ~HugeArray() { std::free(data); }
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  T* data;
  std::size_t numel;
};

// Runs fn(begin, end) over [0, n) in 64K-element tiles, one contiguous run per thread.
void parallel_tiles(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn) {
  constexpr std::size_t kTile = std::size_t{1} << 16;
  const std::size_t tiles = (n + kTile - 1) / kTile;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, tiles),
      [&](const tbb::blocked_range<std::size_t>& r) {
        fn(r.begin() * kTile, std::min(n, r.end() * kTile));
      },
      tbb::static_partitioner());
}

// Median seconds of `steps` calls after `warmup` calls.
double median_seconds(int warmup, int steps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Deterministic pseudo-random values in [-1, 1), filled in parallel.
void fill(float* x, std::size_t n, std::uint64_t seed, float scale) {
  parallel_tiles(n, [=](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      std::uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
      z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
      z ^= z >> 29;
      x[i] = scale * (static_cast<float>(z >> 40) * 0x1p-23f - 1.0f);
    }
  });
}

struct Triad {
  double streaming_gbs;  // non-temporal stores (no read-for-ownership of a)
  double plain_gbs;      // ordinary stores
};

// a = b + s * c over three arrays the size of one Adam state, best of 2 x `steps` runs.
Triad measure_triad(std::size_t n, int warmup, int steps) {
  HugeArray<float> a(n), b(n), c(n);
  fill(a.data, n, 1, 1.0f);
  fill(b.data, n, 2, 1.0f);
  fill(c.data, n, 3, 1.0f);
  const float s = 0.5f;
  const double bytes = 12.0 * static_cast<double>(n);
  auto streaming = [&] {
    parallel_tiles(n, [&](std::size_t begin, std::size_t end) {
      std::size_t i = begin;
      for (; i + 4 <= end; i += 4) {
        const __m128 r = _mm_add_ps(_mm_load_ps(b.data + i),
                                    _mm_mul_ps(_mm_set1_ps(s), _mm_load_ps(c.data + i)));
        _mm_stream_ps(a.data + i, r);
      }
      for (; i < end; ++i) a.data[i] = b.data[i] + s * c.data[i];
    });
    _mm_sfence();
  };
  auto plain = [&] {
    parallel_tiles(n, [&](std::size_t begin, std::size_t end) {
      float* __restrict pa = a.data;
      const float* __restrict pb = b.data;
      const float* __restrict pc = c.data;
      for (std::size_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
    });
  };
  Triad t{};
  t.streaming_gbs = bytes / median_seconds(warmup, 2 * steps, streaming) / 1e9;
  t.plain_gbs = bytes / median_seconds(warmup, 2 * steps, plain) / 1e9;
  return t;
}

int run(const Options& o) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(o.threads));
  at::set_num_threads(o.threads);
  const std::size_t n = o.numel;
  std::printf("zinf_optimizer_bench: numel=%zu threads=%d simd=%s steps=%d (median) warmup=%d\n", n,
              o.threads, std::string(opt::active_simd_level()).c_str(), o.steps, o.warmup);

  const Triad triad = measure_triad(n, o.warmup, o.steps);
  const double triad_gbs = std::max(triad.streaming_gbs, triad.plain_gbs);
  std::printf("triad a=b+s*c:          %7.2f GB/s streaming stores, %7.2f GB/s plain stores\n",
              triad.streaming_gbs, triad.plain_gbs);

  // zinf: fp32 master params, grads and states; the same data feeds torch below.
  HugeArray<float> p(n), g(n), m(n), v(n);
  HugeArray<std::uint16_t> copy(n);
  fill(p.data, n, 11, 1.0f);
  fill(g.data, n, 12, 0.01f);
  std::memset(m.data, 0, n * sizeof(float));
  std::memset(v.data, 0, n * sizeof(float));
  std::memset(copy.data, 0, n * sizeof(std::uint16_t));
  const at::Tensor p0 = torch::from_blob(p.data, {static_cast<std::int64_t>(n)}).clone();
  const at::Tensor g0 = torch::from_blob(g.data, {static_cast<std::int64_t>(n)}).clone();

  const opt::AdamConfig config{.lr = 1e-3f, .weight_decay = 0.0f, .adamw_mode = false};
  opt::AdamOptimizer adam(config);
  std::int64_t step = 0;
  opt::StepArgs args;
  args.params = p.data;
  args.grads = g.data;
  args.exp_avg = m.data;
  args.exp_avg_sq = v.data;
  args.numel = n;
  auto zinf_step = [&] {
    args.step = ++step;
    const opt::StepResult r = adam.step(args);
    if (r.found_nonfinite()) std::fprintf(stderr, "unexpected non-finite gradients\n");
  };
  const double zinf_s = median_seconds(o.warmup, o.steps, zinf_step);
  const int zinf_fp32_steps = static_cast<int>(step);

  // torch::optim::Adam on a copy of the same params and grads.
  at::Tensor tp = p0.clone();
  tp.mutable_grad() = g0.clone();
  torch::optim::Adam torch_adam(std::vector<at::Tensor>{tp},
                                torch::optim::AdamOptions(config.lr)
                                    .betas({config.beta1, config.beta2})
                                    .eps(config.eps)
                                    .weight_decay(config.weight_decay));
  int torch_steps = 0;
  const double torch_s = median_seconds(o.warmup, o.steps, [&] {
    (void)torch_adam.step();
    ++torch_steps;
  });
  // Same data, same number of steps: the results must agree.
  const at::Tensor zinf_p = torch::from_blob(p.data, {static_cast<std::int64_t>(n)});
  const double max_err = (zinf_p - tp).abs().max().item<double>();
  const double max_ref = tp.abs().max().item<double>();

  // With the bf16 copy-out (continuing the same optimizer state).
  args.param_copy = copy.data;
  args.param_copy_dtype = opt::DType::kBFloat16;
  const double zinf_bf16_s = median_seconds(o.warmup, o.steps, zinf_step);

  const double gb = static_cast<double>(n) / 1e9;
  const double zinf_gbs = 28.0 * gb / zinf_s;
  const double zinf_bf16_gbs = 30.0 * gb / zinf_bf16_s;
  std::printf("zinf Adam fp32:          %7.4f s/step %7.2f GB/s  %5.1f%% of triad\n", zinf_s,
              zinf_gbs, 100.0 * zinf_gbs / triad_gbs);
  std::printf("zinf Adam fp32+bf16 copy:%7.4f s/step %7.2f GB/s  %5.1f%% of triad\n", zinf_bf16_s,
              zinf_bf16_gbs, 100.0 * zinf_bf16_gbs / triad_gbs);
  std::printf("torch::optim::Adam:      %7.4f s/step %7.2f GB/s (same 28 B/param)\n", torch_s,
              28.0 * gb / torch_s);
  std::printf("speedup vs torch:        %7.2fx fp32, %.2fx with bf16 copy\n", torch_s / zinf_s,
              torch_s / zinf_bf16_s);
  std::printf("agreement after %d steps: max|p_zinf - p_torch| / max|p_torch| = %.2e\n",
              zinf_fp32_steps, max_err / max_ref);
  if (torch_steps != zinf_fp32_steps) std::fprintf(stderr, "step counts differ\n");
  return 0;
}

}  // namespace
}  // namespace zinf::bench

int main(int argc, char** argv) {
  try {
    return zinf::bench::run(zinf::bench::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zinf_optimizer_bench: %s\n", e.what());
    return 1;
  }
}
