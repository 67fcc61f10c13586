// offload_step bench: how close does one ZeRO-Infinity optimizer step over NVMe come to
// the limits of the machine?
//
// A partition of --params fp32 elements (default 500M) lives on NVMe as params, grads and
// Adam's m and v (16 bytes per element; the step reads 16 and writes 12 bytes per element).
// The bench measures, in one run, on the file system of --dir and with the same block size:
//   - fio's sequential read and write bandwidth (direct I/O, io_uring),
//     giving the I/O lower bound = bytes read / fio read + bytes written / fio write
//     (one device serves both directions);
//   - CPU Adam alone over the same number of elements (in memory, sub-group by sub-group);
//   - the OptimizerSwapper step with pipelining off and on;
// and prints overlap efficiency = max(I/O bound, Adam time) / step time for each mode.
#include <tbb/global_control.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "aio/config.h"
#include "offload/nvme_store.h"
#include "offload/optimizer_swapper.h"
#include "optimizer_cpu/adam.h"

namespace {

using zinf::offload::NvmeStore;
using zinf::offload::NvmeStoreConfig;
using zinf::offload::OptimizerStepOptions;
using zinf::offload::OptimizerSwapper;
using zinf::offload::OptimizerSwapperConfig;

struct Options {
  std::string dir = "/tmp";
  uint64_t params = 500'000'000;
  uint64_t sub_group = 25'000'000;
  uint64_t block_size = 1 << 20;
  int queue_depth = 8;
  int threads = 2;  // aio intra_op_parallelism per queue
  std::string backend = "io_uring";
  int steps = 1;
  uint64_t fio_size = 4ull << 30;  // bytes per fio direction
  std::string fio = "fio";
  bool skip_fio = false;
};

struct FioResult {
  double read_bytes_per_s = 0.0;
  double write_bytes_per_s = 0.0;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

// CPU Adam over `params` elements, one in-memory sub-group at a time: the compute of the
// step without any I/O.
double adam_alone_seconds(const Options& o) {
  const uint64_t group = std::min(o.sub_group, o.params);
  std::vector<float> p(group, 0.5f), g(group, 1e-3f), m(group, 0.0f), v(group, 0.0f);
  std::vector<uint16_t> copy(group);
  zinf::optimizer_cpu::AdamOptimizer adam;
  zinf::optimizer_cpu::StepArgs args;
  args.params = p.data();
  args.grads = g.data();
  args.exp_avg = m.data();
  args.exp_avg_sq = v.data();
  args.param_copy = copy.data();
  args.step = 1;
  const double start = now_seconds();
  for (uint64_t offset = 0; offset < o.params; offset += group) {
    args.numel = std::min(group, o.params - offset);
    (void)adam.step(args);
  }
  return now_seconds() - start;
}

struct StepFigures {
  double seconds = 0.0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  double io_wait = 0.0;
  double compute = 0.0;
  uint64_t pinned = 0;
};

StepFigures run_steps(const Options& o, bool pipeline) {
  NvmeStoreConfig sc;
  sc.nvme_path = o.dir;
  sc.name = pipeline ? "bench_pipelined" : "bench_serial";
  sc.aio.block_size = o.block_size;
  sc.aio.queue_depth = o.queue_depth;
  sc.aio.intra_op_parallelism = o.threads;
  const auto backend = zinf::aio::parse_backend(o.backend);
  if (!backend) {
    throw std::invalid_argument("unknown --backend " + o.backend);
  }
  sc.aio.backend = *backend;
  NvmeStore store(sc);
  zinf::optimizer_cpu::AdamOptimizer adam;
  OptimizerSwapperConfig config;
  config.numel = o.params;
  config.sub_group_size = o.sub_group;
  config.pipeline_read = pipeline;
  config.pipeline_write = pipeline;
  OptimizerSwapper swapper(config, adam, &store);
  {
    // Initial params, written sub-group by sub-group through a reused host array.
    std::vector<float> params(o.params);
    for (uint64_t i = 0; i < o.params; ++i) {
      params[i] = static_cast<float>((i % 1009) * 1e-3);
    }
    swapper.initialize(params.data());
  }
  std::vector<float> grads(std::min<uint64_t>(o.sub_group, o.params), 1e-3f);
  StepFigures figures;
  for (int s = 1; s <= o.steps; ++s) {
    for (uint64_t offset = 0; offset < o.params; offset += grads.size()) {
      swapper.write_grads(offset, grads.data(),
                          std::min<uint64_t>(grads.size(), o.params - offset));
    }
    swapper.reset_counters();
    OptimizerStepOptions options;
    options.step = s;
    const auto report = swapper.step(options);
    const auto c = swapper.counters();
    figures.seconds += report.seconds;
    figures.bytes_read += c.nvme_bytes_read;
    figures.bytes_written += c.nvme_bytes_written;
    figures.io_wait += c.io_wait_seconds;
    figures.compute += c.compute_seconds;
    figures.pinned = swapper.pinned_bytes();
    std::printf("  pipeline %-3s step %d: %.2f s (%s)\n", pipeline ? "on" : "off", s,
                report.seconds, c.to_string().c_str());
    std::fflush(stdout);
  }
  // Steps read and write pool buffers registered with io_uring; initialize() and the grads
  // move caller memory, which takes the normal path.
  const auto stats = store.stats();
  std::printf("  pipeline %-3s aio requests %llu, of which fixed-buffer %llu (whole run)\n",
              pipeline ? "on" : "off", static_cast<unsigned long long>(stats.io_requests),
              static_cast<unsigned long long>(stats.fixed_io_requests));
  return figures;
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
  app.add_option("--steps", o.steps, "steps per mode (times are summed)");
  app.add_option("--fio-size", o.fio_size, "bytes fio reads and writes per direction");
  app.add_option("--fio", o.fio, "fio executable");
  app.add_flag("--skip-fio", o.skip_fio, "no fio run (no I/O bound, no efficiency)");
  CLI11_PARSE(app, argc, argv);

  try {
    const double gb = 1e9;
    std::printf(
        "offload_step: %llu params (%.2f GB of fp32 states on %s), sub_group %llu, "
        "block %llu, queue_depth %d, %d aio threads per queue, %s, %zu CPUs\n",
        static_cast<unsigned long long>(o.params), o.params * 16.0 / gb, o.dir.c_str(),
        static_cast<unsigned long long>(o.sub_group), static_cast<unsigned long long>(o.block_size),
        o.queue_depth, o.threads, o.backend.c_str(),
        static_cast<size_t>(::sysconf(_SC_NPROCESSORS_ONLN)));
    // Other work may share the device (and a cloud volume's throughput drifts), so fio runs
    // right before each mode's step and that mode is judged against its own fio figures.
    const double adam = adam_alone_seconds(o);
    std::printf("CPU Adam alone: %.3f s (%.1f M params/s)\n", adam, o.params / adam / 1e6);
    std::fflush(stdout);
    struct Row {
      bool pipeline;
      FioResult fio;
      StepFigures figures;
    };
    std::vector<Row> rows;
    for (bool pipeline : {false, true}) {
      Row row{pipeline, {}, {}};
      if (!o.skip_fio) {
        row.fio = measure_fio(o);
        std::printf("fio (same fs, bs %llu, direct): read %.3f GB/s, write %.3f GB/s\n",
                    static_cast<unsigned long long>(o.block_size), row.fio.read_bytes_per_s / gb,
                    row.fio.write_bytes_per_s / gb);
      }
      row.figures = run_steps(o, pipeline);
      rows.push_back(row);
    }
    std::printf("\n%-9s %9s %10s %10s %8s %8s %10s %9s %9s %10s %9s\n", "pipeline", "step s",
                "read GB", "write GB", "fio rd", "fio wr", "I/O bnd s", "Adam s", "io wait",
                "pinned GB", "overlap");
    for (const Row& row : rows) {
      const StepFigures& f = row.figures;
      const double steps = o.steps;
      double io_bound = 0.0;
      if (!o.skip_fio) {
        io_bound = f.bytes_read / steps / row.fio.read_bytes_per_s +
                   f.bytes_written / steps / row.fio.write_bytes_per_s;
      }
      const double step = f.seconds / steps;
      const double efficiency = o.skip_fio ? std::nan("") : std::max(io_bound, adam) / step;
      std::printf("%-9s %9.2f %10.2f %10.2f %8.3f %8.3f %10.2f %9.2f %9.2f %10.2f %9.3f\n",
                  row.pipeline ? "on" : "off", step, f.bytes_read / steps / gb,
                  f.bytes_written / steps / gb, row.fio.read_bytes_per_s / gb,
                  row.fio.write_bytes_per_s / gb, io_bound, adam, f.io_wait / steps, f.pinned / gb,
                  efficiency);
    }
    std::printf(
        "\noverlap = max(I/O bound, Adam alone) / step time; I/O bound = bytes read / "
        "fio read + bytes written / fio write (GB/s columns)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
