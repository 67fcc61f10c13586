// bench/train: what offloading costs in training throughput. The bare `zinf train` model and
// config (tools/train_config.h: stage 3, fp32, one decoder layer gathered at a time) trained
// with its params and optimizer states (a) on the accelerator, (b) on CPU, (c) on NVMe
// (max_in_cpu 0; offload_param.buffer_count one per parameter unless --param-buffers says
// otherwise, so the param pool holds every slice) in three ways: `nvme` with the defaults (the
// optimizer overlapped with the backward, its grads in host memory), `nvme-serial` without the
// overlap, `nvme-disk` without either (the grads summed through the swap files); on the
// default corpus from the same seed. Each
// mode runs in a child process of this program (its own peak RSS); the modes are interleaved over
// --rounds rounds in a rotated order; medians of tokens/s and of each round's ratio to the
// no-offload run.
//
//   build/bench/train/zinf_train_bench [--model small] [--steps 8] [--warmup 2] [--rounds 2]
//                                      [--param-buffers N] [--sub-group-size N] [--profile]
// --profile prints, per step of each mode, the engine's wall-clock breakdown (forward,
// backward, step, time blocked per tier), the NVMe bytes each tier read and wrote, and how
// many parameter gathers were issued on demand (a block entered without its parameters) and
// ahead of their block.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "aio/pinned_budget.h"
#include "engine/data/data.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model/llama.h"
#include "tools/train_config.h"

namespace {

using namespace zinf;
namespace fs = std::filesystem;

struct Args {
  std::string model = "small";
  int steps = 8;
  int warmup = 2;
  int rounds = 2;
  int threads = 2;
  int param_buffers = 0;        // nvme: offload_param.buffer_count; 0: one per parameter
  uint64_t sub_group_size = 0;  // nvme: zero_optimization.sub_group_size; 0: the bare config's
  std::string nvme_path = "/var/tmp";
  double clip = -1.0;    // gradient_clipping for every mode; < 0: the bare config's (1.0)
  bool profile = false;  // per-step wall-clock breakdown and bytes per tier (stderr)
  std::string child;     // internal: run one mode and print a RESULT line
};

// This process's bytes read from and written to storage so far (/proc/self/io read_bytes,
// write_bytes): what the swap files really moved, read-modify-writes included. {0, 0} when
// the file cannot be read.
std::pair<uint64_t, uint64_t> process_io() {
  std::ifstream in("/proc/self/io");
  std::pair<uint64_t, uint64_t> io{0, 0};
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") io.first = value;
    if (key == "write_bytes:") io.second = value;
  }
  return io;
}

// One mode in this process: prints "RESULT mode tokens/s rss s/step loss device host nvme".
int run_child(const Args& a) {
  std::string note;
  std::unique_ptr<data::TokenSource> source = data::default_corpus(&note);
  auto model = engine::named_llama(a.model, static_cast<int64_t>(source->vocab_size()));
  if (!model) throw std::runtime_error("unknown model " + a.model);
  const int64_t seq = 64;
  model->max_seq_len = std::max(model->max_seq_len, seq);

  // The bare config with this mode's offload devices.
  nlohmann::json root = tools::bare_config(*model, a.steps, 1);
  nlohmann::json& z = root["zero_optimization"];
  if (a.clip >= 0.0) root["gradient_clipping"] = a.clip;
  std::string swap;
  const bool nvme = a.child == "nvme" || a.child == "nvme-serial" || a.child == "nvme-disk";
  if (nvme) {
    std::string pattern = (fs::path(a.nvme_path) / "zinf-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp in " + a.nvme_path);
    swap = pattern;
    // What a DeepSpeed user sets when the pinned memory allows: a param pool that holds
    // every parameter slice (buffer_size is already the largest parameter), so the params
    // read for one micro-batch's forward serve its backward and the next micro-batches
    // (ParamSwapper::release_cached) instead of being read from NVMe again. max_in_cpu
    // stays 0: every slice lives on NVMe and each step's new values are written there.
    z["offload_param"]["buffer_count"] = a.param_buffers > 0
                                             ? static_cast<size_t>(a.param_buffers)
                                             : engine::llama_parameter_shapes(*model).size();
    if (a.sub_group_size > 0) {
      z["sub_group_size"] = a.sub_group_size;  // sub-groups that cut through the params
    }
    // "nvme" overlaps the optimizer with the backward (zinf.overlap_optimizer's default on
    // NVMe); "nvme-serial" runs the step after the backward, as without the key; both keep the
    // optimizer's grads in host memory (zinf.grad_offload's default where it fits).
    // "nvme-disk" is the path before either: serial, the grads summed through the swap files.
    root["zinf"]["overlap_optimizer"] = a.child == "nvme";
    if (a.child == "nvme-disk") root["zinf"]["grad_offload"] = "nvme";
  } else {
    z.erase("offload_param");
    z.erase("offload_optimizer");
    if (a.child == "cpu") {
      z["offload_param"] = {{"device", "cpu"}};
      z["offload_optimizer"] = {{"device", "cpu"}};
    } else {
      // Everything on the device: the budget is the model states and more.
      root["zinf"]["accelerator"]["memory_budget"] = "4GiB";
    }
  }
  tools::ConfigOverrides overrides;
  overrides.steps = a.steps;
  overrides.nvme_path = swap;
  const config::RunConfig cfg =
      tools::resolve_run_config(root, "bench " + a.child, overrides, *model, nullptr);
  engine::EngineOptions o = tools::engine_options(cfg, zero::LaunchEnv{}, seq, a.threads);
  o.steps_per_print = a.profile ? 1 : 0;
  o.wall_clock_breakdown = a.profile;
  if (a.profile) {
    o.log = [](const std::string& line) { fmt::print(stderr, "[engine] {}\n", line); };
  }
  const int64_t micro = o.micro_batch_size;
  o.activations = engine::llama_activations(*model, micro, seq, 4);

  data::LoaderOptions lo;
  lo.seq_len = seq;
  data::SampleLoader loader(*source, lo);
  std::vector<int64_t> in, tg;
  double timed_seconds = 0, timed_tokens = 0, last_loss = 0, timed_optimizer = 0;
  uint64_t timed_read = 0, timed_written = 0;  // optimizer tier NVMe bytes in timed steps
  engine::MemoryReport mem;
  {
    auto module = std::make_shared<engine::LlamaModelImpl>(*model, at::kFloat);
    engine::Engine eng(module, o, [](const std::string& name, at::Tensor& full) {
      engine::init_parameter(1234, name, full);
    });
    zero::ZeroModelStats prev = eng.zero_model().stats();
    std::pair<uint64_t, uint64_t> prev_io = process_io();
    for (int s = 0; s < a.steps; ++s) {
      const zero::ZeroModelStats before = eng.zero_model().stats();
      const engine::StepReport r = eng.train_batch([&](int) {
        loader.next(micro, in, tg);
        const at::Tensor x = at::from_blob(in.data(), {micro, seq}, at::kLong).clone();
        const at::Tensor y = at::from_blob(tg.data(), {micro, seq}, at::kLong).clone();
        return module->loss(x, y);
      });
      last_loss = r.loss;
      if (a.profile) {
        const zero::ZeroModelStats st = eng.zero_model().stats();
        const std::pair<uint64_t, uint64_t> io = process_io();
        fmt::print(
            stderr,
            "[{}] step {} {:.3f} s | param nvme read {} | optimizer nvme read {} "
            "written {} | param wait {:.3f} s (block wait {:.3f} s; params fetched on "
            "demand {}, ahead {}) | param swap I/O wait {:.3f} s | optimizer I/O wait {:.3f} s "
            "| process disk read {} written {}\n",
            a.child, s + 1, r.seconds,
            engine::format_bytes(st.param_swap.nvme_bytes_read - prev.param_swap.nvme_bytes_read),
            engine::format_bytes(st.optimizer_swap.nvme_bytes_read -
                                 prev.optimizer_swap.nvme_bytes_read),
            engine::format_bytes(st.optimizer_swap.nvme_bytes_written -
                                 prev.optimizer_swap.nvme_bytes_written),
            st.params.wait_seconds - prev.params.wait_seconds,
            st.coordinator.block_wait_seconds - prev.coordinator.block_wait_seconds,
            st.coordinator.on_demand - prev.coordinator.on_demand,
            st.coordinator.prefetched - prev.coordinator.prefetched,
            st.param_swap.io_wait_seconds - prev.param_swap.io_wait_seconds,
            st.optimizer_swap.io_wait_seconds - prev.optimizer_swap.io_wait_seconds,
            engine::format_bytes(io.first - prev_io.first),
            engine::format_bytes(io.second - prev_io.second));
        prev = st;
        prev_io = io;
      }
      if (s >= a.warmup) {
        const zero::ZeroModelStats after = eng.zero_model().stats();
        timed_read += after.optimizer_swap.nvme_bytes_read - before.optimizer_swap.nvme_bytes_read;
        timed_written +=
            after.optimizer_swap.nvme_bytes_written - before.optimizer_swap.nvme_bytes_written;
        timed_optimizer += r.optimizer_seconds;
        timed_seconds += r.seconds;
        timed_tokens += static_cast<double>(micro * seq * eng.gradient_accumulation_steps());
      }
    }
    mem = eng.memory_report();
    if (a.profile) fmt::print(stderr, "[{}] {}\n", a.child, eng.counters_line());
  }
  if (!swap.empty()) fs::remove_all(swap);
  const int timed = std::max(1, a.steps - a.warmup);
  fmt::print("RESULT {} {:.3f} {} {:.3f} {:.4f} {} {} {} {:.4f} {} {}\n", a.child,
             timed_tokens / std::max(timed_seconds, 1e-9), aio::peak_rss_bytes(),
             timed_seconds / timed, last_loss, mem.device_peak, mem.pinned + mem.host, mem.nvme,
             timed_optimizer / timed, timed_read / static_cast<uint64_t>(timed),
             timed_written / static_cast<uint64_t>(timed));
  return 0;
}

struct Result {
  std::string mode;
  double tokens_per_s = 0;
  uint64_t rss = 0;
  double step_s = 0;
  double loss = 0;
  uint64_t device = 0, host = 0, nvme = 0;
  double optimizer_s = 0;          // per step: the optimizer step after the last backward
  uint64_t read = 0, written = 0;  // per step: the optimizer tier's NVMe bytes
};

Result spawn(const std::string& self, const Args& a, const std::string& mode) {
  const std::string cmd = fmt::format(
      "'{}' --child {} --model {} --steps {} --warmup {} --threads {} --nvme-path '{}' "
      "--param-buffers {} --sub-group-size {} --gradient-clipping {}{}",
      self, mode, a.model, a.steps, a.warmup, a.threads, a.nvme_path, a.param_buffers,
      a.sub_group_size, a.clip, a.profile ? " --profile" : "");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("cannot start " + cmd);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  if (status != 0) throw std::runtime_error(fmt::format("mode {} failed:\n{}", mode, out));
  Result r;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RESULT ", 0) != 0) continue;
    std::istringstream f(line.substr(7));
    f >> r.mode >> r.tokens_per_s >> r.rss >> r.step_s >> r.loss >> r.device >> r.host >> r.nvme >>
        r.optimizer_s >> r.read >> r.written;
  }
  if (r.mode.empty()) {
    throw std::runtime_error(fmt::format("mode {} printed no result:\n{}", mode, out));
  }
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zinf bench/train: tokens/s and peak RSS with no offload, CPU and NVMe offload"};
  Args a;
  app.add_option("--model", a.model)->capture_default_str();
  app.add_option("--steps", a.steps, "Steps per run (the first --warmup are not timed)")
      ->capture_default_str();
  app.add_option("--warmup", a.warmup)->capture_default_str();
  app.add_option("--rounds", a.rounds, "Rounds; the five modes run once per round, rotated")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "Compute threads")->capture_default_str();
  app.add_option("--nvme-path", a.nvme_path, "Folder of the NVMe swap files")
      ->capture_default_str();
  app.add_option("--param-buffers", a.param_buffers,
                 "NVMe mode: offload_param.buffer_count (0: one buffer per parameter, so the "
                 "pool holds every slice; the bare config has 4)")
      ->capture_default_str();
  app.add_option("--sub-group-size", a.sub_group_size,
                 "NVMe mode: zero_optimization.sub_group_size (0: the bare config's 1e9, one "
                 "sub-group)")
      ->capture_default_str();
  app.add_option("--gradient-clipping", a.clip,
                 "gradient_clipping of every mode (< 0: the bare config's 1.0). A step that "
                 "clips cannot be overlapped exactly: its norm is known only after the backward, "
                 "so the overlap stands back after a clipped step and redoes a speculated one")
      ->capture_default_str();
  app.add_flag("--profile", a.profile,
               "Per step: wall-clock breakdown, bytes read and written per tier, time blocked");
  app.add_option("--child", a.child)->group("");
  CLI11_PARSE(app, argc, argv);
  try {
    if (a.steps <= a.warmup) throw std::invalid_argument("--steps must be more than --warmup");
    if (!a.child.empty()) return run_child(a);
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    fmt::print(
        "bench/train: the bare zinf train config, {} model, fp32, {} steps ({} untimed), "
        "{} threads, {} rounds, swap in {}\n",
        a.model, a.steps, a.warmup, a.threads, a.rounds, a.nvme_path);
    const std::vector<std::string> modes = {"none", "cpu", "nvme", "nvme-serial", "nvme-disk"};
    std::map<std::string, std::vector<double>> tps, ratio, optimizer_s;
    std::map<std::string, Result> last;
    for (int round = 0; round < a.rounds; ++round) {
      std::map<std::string, double> this_round;
      for (size_t i = 0; i < modes.size(); ++i) {
        const std::string& m = modes[(i + static_cast<size_t>(round)) % modes.size()];
        const Result r = spawn(self, a, m);
        fmt::print(
            "  round {} {:<11} {:>8.1f} tokens/s  {:.2f} s/step (optimizer after the backward "
            "{:.3f} s)  peak RSS {:>10}  loss {:.4f}\n",
            round + 1, m, r.tokens_per_s, r.step_s, r.optimizer_s, engine::format_bytes(r.rss),
            r.loss);
        std::fflush(stdout);
        this_round[m] = r.tokens_per_s;
        tps[m].push_back(r.tokens_per_s);
        optimizer_s[m].push_back(r.optimizer_s);
        last[m] = r;
      }
      for (const auto& m : modes) ratio[m].push_back(this_round[m] / this_round["none"]);
    }
    fmt::print("\n{:<11} {:>10} {:>13} {:>11} {:>11} {:>11} {:>11} {:>12} {:>11} {:>11}\n",
               "offload", "tokens/s", "x no-offload", "peak RSS", "device", "host", "nvme",
               "optimizer s", "read/step", "write/step");
    for (const auto& m : modes) {
      const Result& r = last[m];
      fmt::print("{:<11} {:>10.1f} {:>13.3f} {:>11} {:>11} {:>11} {:>11} {:>12.3f} {:>11} {:>11}\n",
                 m, median(tps[m]), median(ratio[m]), engine::format_bytes(r.rss),
                 engine::format_bytes(r.device), engine::format_bytes(r.host),
                 engine::format_bytes(r.nvme), median(optimizer_s[m]), engine::format_bytes(r.read),
                 engine::format_bytes(r.written));
    }
    fmt::print("nvme / no-offload tokens/s: {:.3f} (median of per-round ratios; target >= 0.9)\n",
               median(ratio["nvme"]));
    const double serial = median(optimizer_s["nvme-serial"]);
    fmt::print(
        "nvme: the trainer's wait for the optimizer after the backward, overlapped / "
        "nvme-serial's step: {:.3f} s / {:.3f} s = {:.3f} (target <= 0.1); tokens/s "
        "overlapped / serial {:.3f}\n",
        median(optimizer_s["nvme"]), serial,
        serial > 0 ? median(optimizer_s["nvme"]) / serial : 0.0,
        median(tps["nvme"]) / std::max(median(tps["nvme-serial"]), 1e-9));
    const Result& disk = last["nvme-disk"];
    fmt::print(
        "nvme: optimizer NVMe bytes per step against nvme-disk's (serial, grads through the swap "
        "files): read {} / {} = {:.3f} (target <= 0.8), written {} / {} = {:.3f}; tokens/s "
        "{:.3f}x\n",
        engine::format_bytes(last["nvme"].read), engine::format_bytes(disk.read),
        disk.read > 0 ? static_cast<double>(last["nvme"].read) / static_cast<double>(disk.read)
                      : 0.0,
        engine::format_bytes(last["nvme"].written), engine::format_bytes(disk.written),
        disk.written > 0
            ? static_cast<double>(last["nvme"].written) / static_cast<double>(disk.written)
            : 0.0,
        median(tps["nvme"]) / std::max(median(tps["nvme-disk"]), 1e-9));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zinf_train_bench: {}\n", e.what());
    return 1;
  }
}
