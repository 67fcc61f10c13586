// zinf_ds_adam_worker: the zinf side of bench_ds_adam.py. Reads fp32 params and grads from
// raw files, runs zinf's CPU Adam/AdamW over them for --warmup untimed and --steps timed
// steps (the same grads every step) on --threads TBB threads, optionally with the fused
// 16-bit copy-out of the updated params, and prints one JSON line with each timed step's
// milliseconds. --out-params / --out-copy write the final fp32 params / 16-bit copy so that
// the driver can compare them with DeepSpeedCPUAdam's. --kernel floor runs, instead of Adam,
// a loop with Adam's memory traffic and no arithmetic (read p, g, m, v; write p, m, v; and
// the 16-bit copy when asked): what any Adam step over these arrays costs at least here.
//
//   zinf_ds_adam_worker --params P.f32 --grads G.f32 [--steps 10] [--warmup 2] [--threads 2]
//       [--adamw 1] [--lr 1e-3] [--weight-decay 0.01] [--copy none|bf16|fp16]
//       [--out-params FILE] [--out-copy FILE] [--kernel adam|floor]
//
// Every array is 2 MiB aligned and advised onto transparent huge pages; the driver gives
// DeepSpeed's torch tensors the same (THP_MEM_ALLOC_ENABLE=1).
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/deepspeed/worker_main.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/simd_level.h"

namespace zinf::bench {
namespace {

namespace opt = zinf::optimizer_cpu;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string params_path;
  std::string grads_path;
  int steps = 10;
  int warmup = 2;
  int threads = 2;
  bool adamw = true;
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  std::string copy = "none";  // none, bf16 or fp16
  std::string out_params;
  std::string out_copy;
  bool floor = false;  // --kernel floor: the memory-traffic loop instead of Adam
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(arg + ": missing value");
    const std::string value = argv[++i];
    if (arg == "--params") {
      o.params_path = value;
    } else if (arg == "--grads") {
      o.grads_path = value;
    } else if (arg == "--steps") {
      o.steps = std::stoi(value);
    } else if (arg == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (arg == "--threads") {
      o.threads = std::stoi(value);
    } else if (arg == "--adamw") {
      o.adamw = std::stoi(value) != 0;
    } else if (arg == "--lr") {
      o.lr = std::stof(value);
    } else if (arg == "--weight-decay") {
      o.weight_decay = std::stof(value);
    } else if (arg == "--copy") {
      o.copy = value;
    } else if (arg == "--out-params") {
      o.out_params = value;
    } else if (arg == "--out-copy") {
      o.out_copy = value;
    } else if (arg == "--kernel") {
      if (value != "adam" && value != "floor") {
        throw std::invalid_argument("--kernel must be adam or floor, not " + value);
      }
      o.floor = value == "floor";
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  if (o.params_path.empty() || o.grads_path.empty()) {
    throw std::invalid_argument("--params and --grads are required");
  }
  if (o.steps < 1 || o.warmup < 0 || o.threads < 1) {
    throw std::invalid_argument("--steps and --threads must be >= 1, --warmup >= 0");
  }
  if (o.copy != "none" && o.copy != "bf16" && o.copy != "fp16") {
    throw std::invalid_argument("--copy must be none, bf16 or fp16, not " + o.copy);
  }
  return o;
}

// `bytes` of zeroed memory, 2 MiB aligned, on transparent huge pages where the kernel
// allows it.
class HugeBuffer {
 public:
  explicit HugeBuffer(std::size_t bytes) : bytes_(bytes) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    data_ = std::aligned_alloc(kHuge, rounded);
    if (data_ == nullptr) throw std::bad_alloc();
    (void)madvise(data_, rounded, MADV_HUGEPAGE);  // advice only: fine if refused
    std::memset(data_, 0, bytes);
  }
  ~HugeBuffer() { std::free(data_); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  void* data_;
  const std::size_t bytes_;
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::size_t file_size(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) throw std::runtime_error("cannot seek " + path);
  const long size = std::ftell(f.get());
  if (size < 0) throw std::runtime_error("cannot size " + path);
  return static_cast<std::size_t>(size);
}

void read_file(const std::string& path, HugeBuffer& into) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  if (std::fread(into.data(), 1, into.bytes(), f.get()) != into.bytes()) {
    throw std::runtime_error("short read of " + path);
  }
}

void write_file(const std::string& path, const HugeBuffer& from) {
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  if (std::fwrite(from.data(), 1, from.bytes(), f.get()) != from.bytes() ||
      std::fflush(f.get()) != 0) {
    throw std::runtime_error("short write of " + path);
  }
}

// Adam's memory traffic over [lo, hi) without its arithmetic: p, g, m and v read, p, m, v
// (and the copy's upper halves, when copy is not null) written.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx2", "default")))
#endif
void traffic_floor(float* __restrict p, const float* __restrict g, float* __restrict m,
                   float* __restrict v, std::uint16_t* __restrict copy, std::size_t lo,
                   std::size_t hi) {
  if (copy == nullptr) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] += g[i];
      m[i] += g[i];
      v[i] += g[i];
    }
    return;
  }
  for (std::size_t i = lo; i < hi; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
    std::uint32_t bits;
    std::memcpy(&bits, &p[i], sizeof bits);
    copy[i] = static_cast<std::uint16_t>(bits >> 16);
  }
}

// traffic_floor over all `numel` elements on the TBB threads, one contiguous run per thread,
// as the optimizer splits its work.
void run_floor(const opt::StepArgs& args) {
  constexpr std::size_t kTile = std::size_t{1} << 16;
  const std::size_t tiles = (args.numel + kTile - 1) / kTile;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, tiles),
      [&](const tbb::blocked_range<std::size_t>& r) {
        traffic_floor(args.params, static_cast<const float*>(args.grads),
                      static_cast<float*>(args.exp_avg), static_cast<float*>(args.exp_avg_sq),
                      static_cast<std::uint16_t*>(args.param_copy), r.begin() * kTile,
                      std::min(args.numel, r.end() * kTile));
      },
      tbb::static_partitioner());
}

int run(const Options& o) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(o.threads));
  const std::size_t bytes = file_size(o.params_path);
  if (bytes == 0 || bytes % sizeof(float) != 0 || file_size(o.grads_path) != bytes) {
    throw std::invalid_argument("--params and --grads must hold the same, non-zero number of fp32");
  }
  const std::size_t numel = bytes / sizeof(float);

  HugeBuffer p(bytes), g(bytes), m(bytes), v(bytes);  // m and v start at zero
  read_file(o.params_path, p);
  read_file(o.grads_path, g);
  const bool with_copy = o.copy != "none";
  HugeBuffer copy(with_copy ? numel * sizeof(std::uint16_t) : 0);

  opt::AdamConfig config;
  config.lr = o.lr;
  config.weight_decay = o.weight_decay;
  config.adamw_mode = o.adamw;
  opt::AdamOptimizer adam(config);
  opt::StepArgs args;
  args.params = static_cast<float*>(p.data());
  args.grads = g.data();
  args.exp_avg = m.data();
  args.exp_avg_sq = v.data();
  args.numel = numel;
  args.param_copy = with_copy ? copy.data() : nullptr;
  args.param_copy_dtype = o.copy == "fp16" ? opt::DType::kFloat16 : opt::DType::kBFloat16;

  std::vector<double> step_ms;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    args.step = i + 1;
    const auto start = Clock::now();
    if (o.floor) {
      run_floor(args);
    } else if (adam.step(args).found_nonfinite()) {
      throw std::runtime_error("non-finite gradients");
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (i >= o.warmup) step_ms.push_back(ms);
  }
  if (!o.out_params.empty()) write_file(o.out_params, p);
  if (!o.out_copy.empty() && with_copy) write_file(o.out_copy, copy);

  std::printf("{\"numel\": %zu, \"threads\": %d, \"simd\": \"%s\", \"optimizer\": \"%s\", ", numel,
              o.threads, std::string(opt::active_simd_level()).c_str(),
              o.floor ? "floor" : std::string(adam.name()).c_str());
  print_json_list_and_close("step_ms", step_ms, 4);
  return 0;
}

}  // namespace
}  // namespace zinf::bench

int main(int argc, char** argv) {
  return zinf::bench::worker_main("zinf_ds_adam_worker", argc, argv, zinf::bench::parse,
                                  zinf::bench::run);
}
