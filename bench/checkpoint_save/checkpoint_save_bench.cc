// Checkpoint save throughput against the disk: a Llama model (350m's shape, --layers deep)
// under ZeRO stage 3 with its params and optimizer states on NVMe swap files in --dir, saved
// with Engine::save_checkpoint (the states streamed sub-group by sub-group from the swap files
// into the checkpoint), beside fio writing as many bytes sequentially with O_DIRECT and 1 MiB
// blocks in the same folder, then reading them back. Each round first trains --train-steps
// steps (a save follows a step in training; 0 saves states no step has touched), then
// saves, runs fio, and loads the checkpoint back. Per round: the save's GB/s, fio's write
// GB/s and their ratio (target >= 0.8); what the save read from the swap files and what it
// took from the optimizer's buffer sets, which still hold the sub-groups the step updated
// last; and the disk bound (those reads at fio's read rate plus the writes at its write
// rate, one after the other) against the save's time. Then the median ratio.
//
// --prepare: the save is prepared before its step (Engine::prepare_checkpoint), so the step
// writes the optimizer states into the checkpoint as it updates them. Each round then times
// --train-steps plain steps (at least 2), then the prepared step and the save; the save's cost
// is what the prepared step took beyond the fastest plain step of the round (step times vary
// by a second or more here, so the fastest errs on the side of a dearer save) plus the save
// call, and its GB/s is the checkpoint's bytes over that cost (the ratio against fio as
// above).
//
//   zinf_checkpoint_save_bench --dir /var/tmp --layers 16 --rounds 3
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/llama.h"

namespace {

namespace fs = std::filesystem;

// fio's GB/s for `bytes` written (then read) sequentially in `file` (O_DIRECT, 1 MiB
// blocks, libaio queue depth 8; writes fsynced at the end). `op`: "write" or "read"; the
// read runs on the file the write left, and removes it.
double fio_gbps(const std::string& file, uint64_t bytes, const std::string& op) {
  const std::string command = fmt::format(
      "fio --name=seq{0} --filename='{1}' --rw={0} --bs=1M --direct=1 --ioengine=libaio "
      "--iodepth=8 --size={2} {3} --output-format=json 2>/dev/null",
      op, file, bytes, op == "write" ? "--end_fsync=1" : "");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run fio");
  std::string out;
  char chunk[4096];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) out.append(chunk, got);
  const int status = ::pclose(pipe);
  if (op == "read" || status != 0) {
    std::error_code ec;
    fs::remove(file, ec);
  }
  if (status != 0) throw std::runtime_error("fio failed: " + out);
  const auto json = nlohmann::json::parse(out);
  const auto& job = json.at("jobs").at(0).at(op);
  const double bytes_done = job.at("io_bytes").get<double>();
  const double ms = job.at("runtime").get<double>();  // includes the final fsync
  return bytes_done / (ms / 1e3) / 1e9;
}

// User + system CPU seconds of the process so far (all threads).
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save throughput of NVMe-resident states against fio"};
  std::string dir = "/var/tmp";
  int64_t layers = 16;
  int rounds = 3;
  double sub_group = 1e8;
  int train_steps = 1;
  bool pipeline = false;
  app.add_option("--dir", dir, "Folder (filesystem) for swap files, checkpoints and fio's file")
      ->capture_default_str();
  app.add_option("--layers", layers, "Decoder layers of the 350m shape (16: ~2.5 GB saved)")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Interleaved fio / save rounds")->capture_default_str();
  app.add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size")
      ->capture_default_str();
  app.add_option("--train-steps", train_steps,
                 "Training steps before each save (micro-batch 1 of 16 tokens)")
      ->capture_default_str();
  bool prepare = false;
  app.add_flag("--prepare", prepare,
               "Prepare each save before its step: the step writes the optimizer states");
  app.add_flag("--pipeline", pipeline,
               "offload_optimizer pipeline_read and pipeline_write (3 buffer sets, not 1)");
  CLI11_PARSE(app, argc, argv);

  try {
    char pattern[] = "zinf-ckpt-bench-XXXXXX";
    const std::string root = (fs::path(dir) / pattern).string();
    std::string made = root;
    if (::mkdtemp(made.data()) == nullptr) throw std::runtime_error("mkdtemp in " + dir);
    struct Cleanup {
      std::string path;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(path, ec);
      }
    } cleanup{made};
    fs::create_directories(fs::path(made) / "swap");

    zinf::engine::LlamaConfig c = *zinf::engine::named_llama("350m", 256);
    c.num_layers = layers;
    zinf::engine::EngineOptions o;
    o.zero.stage = 3;
    o.zero.offload_param = zinf::zero::OffloadTarget::kNvme;
    o.zero.offload_optimizer = zinf::zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {(fs::path(made) / "swap").string()};
    o.zero.sub_group_size = static_cast<uint64_t>(sub_group);
    o.zero.param_max_in_cpu = 0;
    o.zero.pipeline_read = o.zero.pipeline_write = pipeline;
    o.optimizer.type = zinf::optimizer_cpu::OptimizerKind::kAdamW;
    o.steps_per_print = 0;
    o.memory_budget = 64ull << 30;
    const auto start = std::chrono::steady_clock::now();
    auto model = std::make_shared<zinf::engine::LlamaModelImpl>(c);
    zinf::engine::Engine engine(model, o, [](const std::string& name, at::Tensor& full) {
      zinf::engine::init_parameter(1, name, full);
    });
    fmt::print(
        "model: 350m shape, {} layers, {:.0f} M params; states on NVMe in {} ({:.1f} s "
        "to set up)\n",
        layers, static_cast<double>(c.parameter_count()) / 1e6, made,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

    const std::string ckpt = (fs::path(made) / "ckpt").string();
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) {
      std::error_code ec;
      fs::remove_all(ckpt, ec);
      // One training step (forward, backward, optimizer step); returns its seconds.
      auto train_step = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        const at::Tensor tokens =
            at::randint(0, 256, {1, 17}, at::TensorOptions().dtype(at::kLong));
        const at::Tensor x = tokens.narrow(1, 0, 16);
        const at::Tensor y = tokens.narrow(1, 1, 16);
        engine.backward(engine.forward([&] { return model->loss(x, y); }));
        (void)engine.step();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      double plain_step = 1e30;  // the fastest
      const int plain_steps = prepare ? std::max(2, train_steps) : train_steps;
      for (int t = 0; t < plain_steps; ++t) plain_step = std::min(plain_step, train_step());
      double prepared_step = 0.0;
      double step_cpu = 0.0;
      if (prepare) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpu_seconds();
        if (!engine.prepare_checkpoint(ckpt, "bench")) throw std::runtime_error("not prepared");
        (void)train_step();
        prepared_step =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        step_cpu = cpu_seconds() - c0;
      }
      auto& sw = engine.zero_model().optimizer().swapper();
      const zinf::offload::OffloadCounters before = sw.counters();
      const double cpu0 = cpu_seconds();
      zinf::engine::CheckpointReport saved = engine.save_checkpoint(ckpt, "bench");
      const double save_cpu = cpu_seconds() - cpu0;
      if (prepare) {
        if (saved.step_written_bytes == 0) throw std::runtime_error("the step wrote nothing");
        fmt::print(
            "round {}: fastest plain step {:.2f} s | prepared step {:.2f} s (+{:.2f} s, wrote "
            "{:.2f} GB "
            "into the checkpoint; CPU {:.2f} s) | save call {:.2f} s\n",
            r + 1, plain_step, prepared_step, prepared_step - plain_step,
            static_cast<double>(saved.step_written_bytes) / 1e9, step_cpu, saved.seconds);
        if (prepared_step < plain_step) {
          fmt::print(
              "  (the prepared step ran faster than the fastest plain step: the early writes "
              "are lost in the noise of step times; counted as 0 s)\n");
        }
        saved.seconds += std::max(0.0, prepared_step - plain_step);
      }
      const zinf::offload::OffloadCounters after = sw.counters();
      const uint64_t from_disk = after.nvme_bytes_read - before.nvme_bytes_read;
      const uint64_t from_sets = after.cpu_bytes_read - before.cpu_bytes_read;
      const std::string fio_file = (fs::path(made) / "fio.dat").string();
      const double fio = fio_gbps(fio_file, saved.bytes, "write");
      const double fio_read = fio_gbps(fio_file, saved.bytes, "read");
      const zinf::engine::CheckpointReport loaded = engine.load_checkpoint(ckpt);
      const double ratio = saved.gb_per_second() / fio;
      const double bound = static_cast<double>(from_disk) / 1e9 / fio_read +
                           static_cast<double>(saved.bytes) / 1e9 / fio;
      ratios.push_back(ratio);
      fmt::print(
          "round {}: save {:.2f} GB in {:.2f} s = {:.2f} GB/s | fio write {:.2f} GB/s | ratio "
          "{:.2f} | read from swap {:.2f} GB, from the buffer sets {:.2f} GB | fio read {:.2f} "
          "GB/s | disk bound {:.2f} s = {:.2f}x the save | save call CPU {:.2f} s | load {:.2f} "
          "s = {:.2f} GB/s\n",
          r + 1, static_cast<double>(saved.bytes) / 1e9, saved.seconds, saved.gb_per_second(), fio,
          ratio, static_cast<double>(from_disk) / 1e9, static_cast<double>(from_sets) / 1e9,
          fio_read, bound, bound / saved.seconds, save_cpu, loaded.seconds, loaded.gb_per_second());
      std::fflush(stdout);
    }
    std::sort(ratios.begin(), ratios.end());
    fmt::print("median save / fio ratio: {:.2f} (target >= 0.8)\n", ratios[ratios.size() / 2]);
  } catch (const std::exception& e) {
    fmt::print(stderr, "zinf_checkpoint_save_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
