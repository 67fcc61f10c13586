// offload_step bench: how close does one ZeRO-Infinity optimizer step over NVMe come to
// the limits of the machine?
//
// A partition of --params fp32 elements (default 500M) lives on NVMe as params, grads and
// Adam's m and v (16 bytes per element; the step reads 16 and writes 12 bytes per element).
// Every state is filled with random data (sign, 3 exponent bits and the 23 mantissa bits
// random: nothing a disk or a virtual disk can compress or deduplicate), and fresh random
// grads are written before every step, untimed, as a backward pass would.
//
// For each configuration (pipelining off / on, swap checksums off / on), in one run, on the
// file system of --dir:
//   - fio's sequential write then read bandwidth (direct I/O, io_uring, same block size),
//     right before the configuration, giving the serial I/O bound = bytes read / fio read +
//     bytes written / fio write;
//   - one untimed OptimizerSwapper step, then --steps interleaved rounds of
//       the step (Adam),
//       the I/O-only step (the same swapper, extents, reads and writes, with an optimizer
//         that leaves the buffers as they are), and
//       Adam alone over one in-memory sub-group buffer set, --params elements;
//   - medians of each, and pipeline efficiency = max(I/O-only, Adam alone) / step, which
//     cannot exceed 1 beyond noise: the step does the I/O-only step's transfers and Adam's
//     compute.
// Then, per pipeline mode, the cost of checksums: step with / step without.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "aio/config.h"
#include "offload/nvme_store.h"
#include "offload/optimizer_swapper.h"
#include "offload/sub_groups.h"
#include "optimizer_cpu/adam.h"

namespace {

using zinf::offload::NvmeStore;
using zinf::offload::NvmeStoreConfig;
using zinf::offload::OptimizerState;
using zinf::offload::OptimizerStepOptions;
using zinf::offload::OptimizerSwapper;
using zinf::offload::OptimizerSwapperConfig;
namespace oc = zinf::optimizer_cpu;

struct Options {
  std::string dir = "/tmp";
  uint64_t params = 500'000'000;
  uint64_t sub_group = 25'000'000;
  uint64_t block_size = 1 << 20;
  int queue_depth = 8;
  int threads = 2;  // aio intra_op_parallelism per queue
  std::string backend = "io_uring";
  int steps = 3;                   // timed rounds per configuration
  std::string pipeline = "both";   // off | on | both
  std::string checksums = "both";  // off | on | both
  uint64_t seed = 20250806;
  uint64_t fio_size = 4ull << 30;  // bytes per fio direction
  std::string fio = "fio";
  bool skip_fio = false;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) {
    return std::nan("");
  }
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------------------------------
// Random, incompressible fp32 data

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = seed ^ (a * 0xD6E8FEB86659FD93ull) ^ (b * 0xA0761D6478BD642Full) ^
               (c * 0xE7037ED1A0B428DBull);
  return splitmix64(s);
}

// Fills data[numel] with normal (never subnormal, NaN or Inf) floats whose sign, mantissa
// and 3 exponent bits are random: magnitudes in [2^(top-7), 2^(top+1)), 27 random bits in
// every 32. `positive` clears the sign (Adam's v). Deterministic for a seed, any threads.
void fill_random(float* data, uint64_t numel, uint64_t seed, int top_exponent, bool positive) {
  constexpr uint64_t kChunk = 1 << 16;
  const uint64_t chunks = (numel + kChunk - 1) / kChunk;
  const uint32_t sign_mask = positive ? 0u : 0x80000000u;
  tbb::parallel_for(tbb::blocked_range<uint64_t>(0, chunks), [&](const auto& range) {
    for (uint64_t chunk = range.begin(); chunk != range.end(); ++chunk) {
      uint64_t state = mix_seed(seed, chunk, 0, 0);
      const uint64_t begin = chunk * kChunk;
      const uint64_t end = std::min(numel, begin + kChunk);
      for (uint64_t i = begin; i < end; i += 2) {
        const uint64_t x = splitmix64(state);
        for (uint64_t j = 0; j < 2 && i + j < end; ++j) {
          const auto w = static_cast<uint32_t>(x >> (32 * j));
          const uint32_t exponent = static_cast<uint32_t>(127 + top_exponent) - ((w >> 23) & 7u);
          const uint32_t bits = (w & sign_mask) | (exponent << 23) | (w & 0x7FFFFFu);
          std::memcpy(&data[i + j], &bits, sizeof bits);
        }
      }
    }
  });
}

// Typical magnitudes: params around 1, grads and m around 1e-3, v around 1e-6.
void fill_state(float* data, uint64_t numel, uint64_t seed, OptimizerState state) {
  switch (state) {
    case OptimizerState::kParams:
      fill_random(data, numel, seed, -1, false);
      break;
    case OptimizerState::kGrads:
    case OptimizerState::kExpAvg:
      fill_random(data, numel, seed, -10, false);
      break;
    case OptimizerState::kExpAvgSq:
      fill_random(data, numel, seed, -20, true);
      break;
  }
}

// 4096-byte aligned host array (the swapper's transfers from it then need no bounce).
struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats aligned_floats(uint64_t numel) {
  const size_t bytes = (numel * sizeof(float) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  if (p == nullptr) {
    throw std::bad_alloc();
  }
  return AlignedFloats(static_cast<float*>(p));
}

// ---------------------------------------------------------------------------------------
// fio, the peer: same file system, same block size, right before each configuration

struct FioResult {
  double read_bytes_per_s = 0.0;
  double write_bytes_per_s = 0.0;
};

// Runs one fio job and returns its bandwidth in bytes/s for `rw` ("read" or "write").
double run_fio(const Options& o, const std::string& file, const std::string& rw) {
  const std::string command =
      o.fio + " --name=zinf_offload_step --filename=" + file + " --rw=" + rw +
      " --bs=" + std::to_string(o.block_size) + " --size=" + std::to_string(o.fio_size) +
      " --direct=1 --ioengine=io_uring --iodepth=" + std::to_string(o.queue_depth * o.threads) +
      " --numjobs=1 --output-format=json 2>&1";
  std::printf("  fio: %s\n", command.c_str());
  std::fflush(stdout);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    throw std::runtime_error("cannot run fio: " + command);
  }
  std::string output;
  std::array<char, 4096> chunk{};
  size_t got = 0;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0) {
    output.append(chunk.data(), got);
  }
  const int status = ::pclose(pipe);
  const size_t json_start = output.find('{');
  if (status != 0 || json_start == std::string::npos) {
    throw std::runtime_error("fio failed (status " + std::to_string(status) + "): " + output);
  }
  const nlohmann::json result = nlohmann::json::parse(output.substr(json_start));
  return result.at("jobs").at(0).at(rw).at("bw_bytes").get<double>();
}

FioResult measure_fio(const Options& o) {
  const std::string file = o.dir + "/zinf_offload_step_fio.bin";
  FioResult result;
  result.write_bytes_per_s = run_fio(o, file, "write");  // also lays the file out
  result.read_bytes_per_s = run_fio(o, file, "read");
  std::filesystem::remove(file);
  return result;
}

// ---------------------------------------------------------------------------------------
// Adam, and the optimizer of the I/O-only step

// Adam, or (io_only) an optimizer that leaves every buffer as it is, so that the swapper's
// step does exactly its reads and writes. One object, so that both steps run through the
// same swapper over the same extents.
class SwitchableAdam final : public oc::Optimizer {
 public:
  [[nodiscard]] oc::StepResult step(const oc::StepArgs& args) override {
    if (io_only_) {
      return {};
    }
    return adam_.step(args);
  }
  [[nodiscard]] float lr() const override { return adam_.lr(); }
  void set_lr(float lr) override { adam_.set_lr(lr); }
  [[nodiscard]] std::string_view name() const noexcept override { return adam_.name(); }
  [[nodiscard]] oc::OptimizerKind kind() const noexcept override { return adam_.kind(); }
  void set_io_only(bool io_only) noexcept { io_only_ = io_only; }

 private:
  oc::AdamOptimizer adam_;
  bool io_only_ = false;
};

// One sub-group's arrays in memory, for Adam alone: the compute of the step without I/O.
class InMemoryAdam {
 public:
  explicit InMemoryAdam(const Options& o)
      : group_(std::min(o.sub_group, o.params)),
        params_(o.params),
        p_(aligned_floats(group_)),
        g_(aligned_floats(group_)),
        m_(aligned_floats(group_)),
        v_(aligned_floats(group_)),
        copy_(group_) {
    fill_state(p_.get(), group_, mix_seed(o.seed, 1000, 0, 0), OptimizerState::kParams);
    fill_state(g_.get(), group_, mix_seed(o.seed, 1000, 1, 0), OptimizerState::kGrads);
    fill_state(m_.get(), group_, mix_seed(o.seed, 1000, 2, 0), OptimizerState::kExpAvg);
    fill_state(v_.get(), group_, mix_seed(o.seed, 1000, 3, 0), OptimizerState::kExpAvgSq);
  }

  // Adam over `params` elements, one sub-group buffer set at a time (as the step does,
  // with the 16-bit copy); returns seconds.
  double step() {
    oc::StepArgs args;
    args.params = p_.get();
    args.grads = g_.get();
    args.exp_avg = m_.get();
    args.exp_avg_sq = v_.get();
    args.param_copy = copy_.data();
    args.step = ++step_;
    const double start = now_seconds();
    for (uint64_t offset = 0; offset < params_; offset += group_) {
      args.numel = std::min(group_, params_ - offset);
      (void)adam_.step(args);
    }
    return now_seconds() - start;
  }

 private:
  const uint64_t group_;
  const uint64_t params_;
  AlignedFloats p_, g_, m_, v_;
  std::vector<uint16_t> copy_;
  oc::AdamOptimizer adam_;
  int64_t step_ = 0;
};

// ---------------------------------------------------------------------------------------
// One configuration: fio, then the swapper's steps

struct ConfigResult {
  bool pipeline = false;
  bool checksums = false;
  std::optional<FioResult> fio;
  double step = 0.0;     // median s
  double io_only = 0.0;  // median s
  double adam = 0.0;     // median s
  double io_wait = 0.0;  // median s of the step's time blocked on I/O
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t pinned = 0;
};

ConfigResult run_config(const Options& o, bool pipeline, bool checksums, uint64_t config_index,
                        InMemoryAdam& memory_adam) {
  ConfigResult result;
  result.pipeline = pipeline;
  result.checksums = checksums;
  const char* label = pipeline ? "on " : "off";
  const char* cks = checksums ? "on " : "off";
  std::printf("\n== pipeline %s, checksums %s ==\n", label, cks);
  if (!o.skip_fio) {
    result.fio = measure_fio(o);
    std::printf("  fio (same fs, bs %llu, direct): read %.3f GB/s, write %.3f GB/s\n",
                static_cast<unsigned long long>(o.block_size), result.fio->read_bytes_per_s / 1e9,
                result.fio->write_bytes_per_s / 1e9);
  }

  NvmeStoreConfig sc;
  sc.nvme_path = o.dir;
  sc.name = "bench_offload_step";
  sc.checksums = checksums;
  sc.aio.block_size = o.block_size;
  sc.aio.queue_depth = o.queue_depth;
  sc.aio.intra_op_parallelism = o.threads;
  const auto backend = zinf::aio::parse_backend(o.backend);
  if (!backend) {
    throw std::invalid_argument("unknown --backend " + o.backend);
  }
  sc.aio.backend = *backend;
  NvmeStore store(sc);
  SwitchableAdam optimizer;
  OptimizerSwapperConfig config;
  config.sub_groups = zinf::offload::cut_sub_groups(o.params, o.sub_group).sizes();
  config.pipeline_read = pipeline;
  config.pipeline_write = pipeline;
  OptimizerSwapper swapper(config, optimizer, &store);
  result.pinned = swapper.pinned_bytes();

  // Every state of every sub-group gets its own random data (untimed).
  AlignedFloats host = aligned_floats(std::min(o.sub_group, o.params));
  const double fill_start = now_seconds();
  for (size_t g = 0; g < swapper.sub_group_count(); ++g) {
    const uint64_t numel = swapper.sub_group_range(g).second;
    for (OptimizerState state : {OptimizerState::kParams, OptimizerState::kGrads,
                                 OptimizerState::kExpAvg, OptimizerState::kExpAvgSq}) {
      fill_state(host.get(), numel, mix_seed(o.seed, config_index, g, static_cast<int>(state)),
                 state);
      swapper.write_sub_group(state, g, host.get());
    }
  }
  std::printf("  states filled with random data: %.2f GB in %.2f s\n", o.params * 16.0 / 1e9,
              now_seconds() - fill_start);

  uint64_t grads_round = 0;
  int64_t step_number = 0;
  struct Sample {
    double seconds;
    double io_wait;
    uint64_t read;
    uint64_t written;
  };
  // One swapper step after fresh random grads (untimed), Adam or I/O-only.
  auto swapper_step = [&](bool io_only) {
    ++grads_round;
    for (size_t g = 0; g < swapper.sub_group_count(); ++g) {
      const uint64_t numel = swapper.sub_group_range(g).second;
      fill_state(host.get(), numel, mix_seed(o.seed, config_index, g, 100 + grads_round),
                 OptimizerState::kGrads);
      swapper.write_sub_group(OptimizerState::kGrads, g, host.get());
    }
    optimizer.set_io_only(io_only);
    swapper.reset_counters();
    OptimizerStepOptions options;
    options.step = io_only ? std::max<int64_t>(step_number, 1) : ++step_number;
    const auto report = swapper.step(options);
    const auto c = swapper.counters();
    optimizer.set_io_only(false);
    return Sample{report.seconds, c.io_wait_seconds, c.nvme_bytes_read, c.nvme_bytes_written};
  };

  const Sample warm = swapper_step(false);
  std::printf("  untimed step: %.2f s\n", warm.seconds);
  std::vector<double> steps, io_only, adam, io_wait;
  for (int round = 0; round < o.steps; ++round) {
    // The order rotates each round, so drift of the device hits every kind alike.
    for (int k = 0; k < 3; ++k) {
      switch ((k + round) % 3) {
        case 0: {
          const Sample s = swapper_step(false);
          steps.push_back(s.seconds);
          io_wait.push_back(s.io_wait);
          result.bytes_read = s.read;
          result.bytes_written = s.written;
          std::printf("  round %d step     %.3f s (io wait %.3f s)\n", round + 1, s.seconds,
                      s.io_wait);
          break;
        }
        case 1: {
          const Sample s = swapper_step(true);
          io_only.push_back(s.seconds);
          std::printf("  round %d I/O-only %.3f s (%.3f GB read, %.3f GB written)\n", round + 1,
                      s.seconds, s.read / 1e9, s.written / 1e9);
          break;
        }
        default: {
          adam.push_back(memory_adam.step());
          std::printf("  round %d Adam     %.3f s (in memory)\n", round + 1, adam.back());
          break;
        }
      }
      std::fflush(stdout);
    }
  }
  result.step = median(steps);
  result.io_only = median(io_only);
  result.adam = median(adam);
  result.io_wait = median(io_wait);
  const auto stats = store.stats();
  std::printf("  aio requests %llu, of which fixed-buffer %llu (whole configuration)\n",
              static_cast<unsigned long long>(stats.io_requests),
              static_cast<unsigned long long>(stats.fixed_io_requests));
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zinf offload_step bench: one optimizer step with states on NVMe"};
  app.add_option("--dir", o.dir, "directory on the file system under test")
      ->check(CLI::ExistingDirectory);
  app.add_option("--params", o.params, "fp32 elements in the partition");
  app.add_option("--sub-group", o.sub_group, "zero_optimization.sub_group_size (elements)");
  app.add_option("--block-size", o.block_size, "aio.block_size and fio --bs (bytes)");
  app.add_option("--queue-depth", o.queue_depth, "aio.queue_depth");
  app.add_option("--threads", o.threads, "aio.intra_op_parallelism per I/O queue");
  app.add_option("--backend", o.backend, "io_uring, libaio or psync");
  app.add_option("--steps", o.steps, "timed rounds per configuration (medians)")
      ->check(CLI::PositiveNumber);
  app.add_option("--pipeline", o.pipeline, "pipeline_read/_write: off, on or both")
      ->check(CLI::IsMember({"off", "on", "both"}));
  app.add_option("--checksums", o.checksums, "swap extent checksums: off, on or both")
      ->check(CLI::IsMember({"off", "on", "both"}));
  app.add_option("--seed", o.seed, "seed of the random states");
  app.add_option("--fio-size", o.fio_size, "bytes fio reads and writes per direction");
  app.add_option("--fio", o.fio, "fio executable");
  app.add_flag("--skip-fio", o.skip_fio, "no fio run (no I/O bound)");
  CLI11_PARSE(app, argc, argv);

  try {
    const double gb = 1e9;
    std::printf(
        "offload_step: %llu params (%.2f GB of fp32 states on %s), sub_group %llu, block %llu, "
        "queue_depth %d, %d aio threads per queue, %s, %zu CPUs, seed %llu, %d timed rounds\n",
        static_cast<unsigned long long>(o.params), o.params * 16.0 / gb, o.dir.c_str(),
        static_cast<unsigned long long>(o.sub_group), static_cast<unsigned long long>(o.block_size),
        o.queue_depth, o.threads, o.backend.c_str(),
        static_cast<size_t>(::sysconf(_SC_NPROCESSORS_ONLN)),
        static_cast<unsigned long long>(o.seed), o.steps);
    InMemoryAdam memory_adam(o);
    (void)memory_adam.step();  // untimed: first touch of the copy buffer, TBB's threads

    std::vector<bool> pipelines, checksums;
    for (bool v : {false, true}) {
      if (o.pipeline == "both" || (o.pipeline == "on") == v) {
        pipelines.push_back(v);
      }
      if (o.checksums == "both" || (o.checksums == "on") == v) {
        checksums.push_back(v);
      }
    }
    std::vector<ConfigResult> results;
    uint64_t index = 0;
    for (bool pipeline : pipelines) {
      for (bool cks : checksums) {
        results.push_back(run_config(o, pipeline, cks, index++, memory_adam));
      }
    }

    std::printf("\nmedians of %d rounds; GB = 10^9 bytes\n", o.steps);
    std::printf("%-8s %-8s %8s %10s %8s %10s %8s %8s %10s %10s %8s %9s\n", "pipeline", "checksum",
                "step s", "I/O-only s", "Adam s", "efficiency", "fio rd", "fio wr", "fio bnd s",
                "fio/I/O", "io wait", "pinned GB");
    for (const ConfigResult& r : results) {
      double bound = std::nan("");
      if (r.fio) {
        bound = r.bytes_read / r.fio->read_bytes_per_s + r.bytes_written / r.fio->write_bytes_per_s;
      }
      const double efficiency = std::max(r.io_only, r.adam) / r.step;
      std::printf("%-8s %-8s %8.3f %10.3f %8.3f %10.3f %8.3f %8.3f %10.3f %10.3f %8.3f %9.2f\n",
                  r.pipeline ? "on" : "off", r.checksums ? "on" : "off", r.step, r.io_only, r.adam,
                  efficiency, r.fio ? r.fio->read_bytes_per_s / gb : std::nan(""),
                  r.fio ? r.fio->write_bytes_per_s / gb : std::nan(""), bound, bound / r.io_only,
                  r.io_wait, r.pinned / gb);
    }
    if (!results.empty()) {
      std::printf("per step: %.2f GB read, %.2f GB written\n", results.front().bytes_read / gb,
                  results.front().bytes_written / gb);
    }
    for (bool pipeline : pipelines) {
      const ConfigResult* off = nullptr;
      const ConfigResult* on = nullptr;
      for (const ConfigResult& r : results) {
        if (r.pipeline == pipeline) {
          (r.checksums ? on : off) = &r;
        }
      }
      if (off != nullptr && on != nullptr) {
        std::printf(
            "checksum cost, pipeline %-3s: step %.3f / %.3f s = %.3f x, I/O-only %.3f / %.3f s = "
            "%.3f x\n",
            pipeline ? "on" : "off", on->step, off->step, on->step / off->step, on->io_only,
            off->io_only, on->io_only / off->io_only);
      }
    }
    std::printf(
        "\nefficiency = max(I/O-only, Adam alone) / step (<= 1 up to noise); fio bnd = bytes "
        "read / fio read + bytes written / fio write (serial); fio/I/O = fio bnd / I/O-only "
        "step\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
