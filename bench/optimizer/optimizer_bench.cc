// zinf_optimizer_bench: one Adam step over N fp32 params (default 64M) at T threads
// (default 2), timed for zinf's CPU Adam (fp32, and with the bf16 copy-out) and for
// LibTorch's torch::optim::Adam on the same data, against the memory bandwidth of a
// STREAM-triad-like loop measured in the same run at the same thread count.
//
//   zinf_optimizer_bench [--numel N] [--threads T] [--steps S] [--warmup W]
//
// Traffic counted per param: Adam reads p, g, m, v and writes p, m, v (7 x 4 = 28 bytes),
// + 2 with the bf16 copy; the triad a = b + s*c counts 12 bytes per float, as STREAM does.
// Times are the median of S rounds after W warm-up rounds; each round runs every loop once,
// each after evicting the caches, so that all see the same background load.
#include <ATen/Parallel.h>
#include <emmintrin.h>
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// The bandwidth loops, compiled for AVX-512 and a baseline and picked at run time like the
// kernels, so that the reference is as fast as the machine allows.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ZINF_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
__attribute__((target("avx512f"))) void triad_streaming_avx512(float* a, const float* b,
                                                               const float* c, float s,
                                                               std::size_t lo, std::size_t hi) {
  const __m512 vs = _mm512_set1_ps(s);
  for (std::size_t i = lo; i < hi; i += 16) {
    _mm512_stream_ps(a + i, _mm512_fmadd_ps(vs, _mm512_load_ps(c + i), _mm512_load_ps(b + i)));
  }
}
#else
#define ZINF_BENCH_CLONES
#endif

// a must be 16-byte aligned at lo; hi - lo a multiple of 16.
void triad_streaming(float* a, const float* b, const float* c, float s, std::size_t lo,
                     std::size_t hi) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512f")) {
    triad_streaming_avx512(a, b, c, s, lo, hi);
    return;
  }
#endif
  const __m128 vs = _mm_set1_ps(s);
  for (std::size_t i = lo; i < hi; i += 4) {
    _mm_stream_ps(a + i, _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i))));
  }
}

ZINF_BENCH_CLONES void triad_plain(float* __restrict a, const float* __restrict b,
                                   const float* __restrict c, float s, std::size_t lo,
                                   std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}

// Adam's memory traffic without its arithmetic: read p, g, m, v; write p, m, v.
ZINF_BENCH_CLONES void adam_skeleton(float* __restrict p, const float* __restrict g,
                                     float* __restrict m, float* __restrict v, std::size_t lo,
                                     std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

// Evicts the caches (L3 included: hundreds of MiB on big servers) by reading a buffer 4x
// their size, so that a timed loop neither reuses data left by an earlier one nor pays for
// the write-back of another loop's dirty lines.
class CacheFlusher {
 public:
  CacheFlusher() : buffer_(flush_elements()) { fill(buffer_.data, buffer_.numel, 9, 1.0f); }
  void flush() {
    parallel_tiles(buffer_.numel, [&](std::size_t lo, std::size_t hi) {
      float sum = 0;
      for (std::size_t i = lo; i < hi; i += 16) sum += buffer_.data[i];  // one per line
      sink_ += sum;
    });
  }

 private:
  static std::size_t flush_elements() {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const std::size_t bytes =
        std::max<std::size_t>(std::size_t{1} << 30, 4 * static_cast<std::size_t>(std::max(l3, 0L)));
    return bytes / sizeof(float);
  }
  HugeArray<float> buffer_;
  std::atomic<float> sink_{0};
};

// Seconds of one call of each of `loops`, interleaved round by round so that all of them see
// the same background load (the machine may be shared), each after a cache flush: the median
// per loop over `rounds` rounds, after `warmup` rounds.
std::vector<double> interleaved_medians(int warmup, int rounds,
                                        const std::vector<std::function<void()>>& loops) {
  CacheFlusher flusher;
  std::vector<std::vector<double>> t(loops.size());
  for (int r = 0; r < warmup + rounds; ++r) {
    for (std::size_t k = 0; k < loops.size(); ++k) {
      flusher.flush();
      const auto start = Clock::now();
      loops[k]();
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      if (r >= warmup) t[k].push_back(s);
    }
  }
  std::vector<double> medians;
  for (auto& times : t) {
    std::sort(times.begin(), times.end());
    medians.push_back(times[times.size() / 2]);
  }
  return medians;
}

int run(const Options& o) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(o.threads));
  at::set_num_threads(o.threads);
  const std::size_t n = o.numel;
  const auto n64 = static_cast<std::int64_t>(n);
  std::printf("zinf_optimizer_bench: numel=%zu threads=%d simd=%s steps=%d (median) warmup=%d\n", n,
              o.threads, std::string(opt::active_simd_level()).c_str(), o.steps, o.warmup);

  // zinf: fp32 master params, grads and states, and a bf16 copy.
  HugeArray<float> p(n), g(n), m(n), v(n);
  HugeArray<std::uint16_t> copy(n);
  fill(p.data, n, 11, 1.0f);
  fill(g.data, n, 12, 0.01f);
  std::memset(m.data, 0, n * sizeof(float));
  std::memset(v.data, 0, n * sizeof(float));
  std::memset(copy.data, 0, n * sizeof(std::uint16_t));

  const opt::AdamConfig config{.lr = 1e-3f, .weight_decay = 0.0f, .adamw_mode = false};
  opt::AdamOptimizer adam(config);
  std::int64_t step = 0;
  opt::StepArgs args;
  args.params = p.data;
  args.grads = g.data;
  args.exp_avg = m.data;
  args.exp_avg_sq = v.data;
  args.numel = n;
  auto zinf_step = [&](bool with_copy) {
    args.step = ++step;
    args.param_copy = with_copy ? copy.data : nullptr;
    args.param_copy_dtype = opt::DType::kBFloat16;
    const opt::StepResult r = adam.step(args);
    if (r.found_nonfinite()) std::fprintf(stderr, "unexpected non-finite gradients\n");
  };

  // 1. torch::optim::Adam on a copy of the same params and grads; after the same number of
  //    steps the two must agree.
  at::Tensor tp = torch::from_blob(p.data, {n64}).clone();
  tp.mutable_grad() = torch::from_blob(g.data, {n64}).clone();
  torch::optim::Adam torch_adam(std::vector<at::Tensor>{tp},
                                torch::optim::AdamOptions(config.lr)
                                    .betas({config.beta1, config.beta2})
                                    .eps(config.eps)
                                    .weight_decay(config.weight_decay));
  constexpr int kCheckSteps = 3;
  for (int i = 0; i < kCheckSteps; ++i) {
    zinf_step(false);
    (void)torch_adam.step();
  }
  const double agreement = (torch::from_blob(p.data, {n64}) - tp).abs().max().item<double>() /
                           tp.abs().max().item<double>();

  // 2. zinf (fp32, and with the bf16 copy), torch, the triad and Adam's memory skeleton,
  //    interleaved. The reference loops get their own arrays, all 2 MiB aligned.
  const std::size_t n16 = n / 16 * 16;  // whole vectors for the streaming triad
  HugeArray<float> a(n), b(n), c(n), sp(n), sg(n), sm(n), sv(n);
  for (float* x : {a.data, b.data, c.data, sp.data, sg.data, sm.data, sv.data}) {
    fill(x, n, 5, 1.0f);
  }
  const float s = 0.5f;
  const std::vector<double> t =
      interleaved_medians(o.warmup, o.steps,
                          {[&] { zinf_step(false); }, [&] { zinf_step(true); },
                           [&] {
                             parallel_tiles(n16, [&](std::size_t lo, std::size_t hi) {
                               triad_streaming(a.data, b.data, c.data, s, lo, hi);
                             });
                             _mm_sfence();
                           },
                           [&] {
                             parallel_tiles(n, [&](std::size_t lo, std::size_t hi) {
                               triad_plain(a.data, b.data, c.data, s, lo, hi);
                             });
                           },
                           [&] {
                             parallel_tiles(n, [&](std::size_t lo, std::size_t hi) {
                               adam_skeleton(sp.data, sg.data, sm.data, sv.data, lo, hi);
                             });
                           },
                           [&] { (void)torch_adam.step(); }});
  const double gn = static_cast<double>(n) / 1e9;
  const double zinf_gbs = 28.0 * gn / t[0];
  const double zinf_bf16_gbs = 30.0 * gn / t[1];
  const double triad_streaming_gbs = 12.0 * static_cast<double>(n16) / 1e9 / t[2];
  const double triad_plain_gbs = 12.0 * gn / t[3];
  const double triad_gbs = std::max(triad_streaming_gbs, triad_plain_gbs);
  const double skeleton_gbs = 28.0 * gn / t[4];
  const double torch_s = t[5];

  std::printf("triad a=b+s*c:             %7.2f GB/s (streaming stores; %.2f GB/s plain stores)\n",
              triad_streaming_gbs, triad_plain_gbs);
  std::printf("Adam skeleton (no math):   %7.2f GB/s (p+=g, m+=g, v+=g; 28 B/param)\n",
              skeleton_gbs);
  std::printf(
      "zinf Adam fp32:            %7.4f s/step %7.2f GB/s = %5.1f%% of triad, %5.1f%% of "
      "skeleton\n",
      t[0], zinf_gbs, 100.0 * zinf_gbs / triad_gbs, 100.0 * zinf_gbs / skeleton_gbs);
  std::printf(
      "zinf Adam fp32 + bf16 copy:%7.4f s/step %7.2f GB/s = %5.1f%% of triad (30 B/param)\n", t[1],
      zinf_bf16_gbs, 100.0 * zinf_bf16_gbs / triad_gbs);
  std::printf("torch::optim::Adam:        %7.4f s/step %7.2f GB/s\n", torch_s, 28.0 * gn / torch_s);
  std::printf("speedup vs torch:          %7.2fx fp32, %.2fx with bf16 copy\n", torch_s / t[0],
              torch_s / t[1]);
  std::printf("agreement after %d steps:  max|p_zinf - p_torch| / max|p_torch| = %.2e\n",
              kCheckSteps, agreement);
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
