// Checkpoint save throughput against the disk: a Llama model (350m's shape, --layers deep)
// under ZeRO stage 3 with its params and optimizer states on NVMe swap files in --dir, saved
// with Engine::save_checkpoint (the states streamed sub-group by sub-group from the swap files
// into the checkpoint), beside fio writing as many bytes sequentially with O_DIRECT and 1 MiB
// blocks in the same folder. Rounds alternate fio and save, so both see the same disk state;
// each round prints both figures and their ratio, then the median ratio (target >= 0.8).
// The checkpoint is loaded back once per round too (load GB/s).
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

// fio's write GB/s for `bytes` written sequentially to `file` (O_DIRECT, 1 MiB blocks,
// libaio queue depth 8, fsync at the end).
double fio_write_gbps(const std::string& file, uint64_t bytes) {
  const std::string command = fmt::format(
      "fio --name=seqwrite --filename='{}' --rw=write --bs=1M --direct=1 --ioengine=libaio "
      "--iodepth=8 --size={} --end_fsync=1 --output-format=json 2>/dev/null",
      file, bytes);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run fio");
  std::string out;
  char chunk[4096];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) out.append(chunk, got);
  const int status = ::pclose(pipe);
  std::error_code ec;
  fs::remove(file, ec);
  if (status != 0) throw std::runtime_error("fio failed: " + out);
  const auto json = nlohmann::json::parse(out);
  const auto& job = json.at("jobs").at(0).at("write");
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
  app.add_option("--dir", dir, "Folder (filesystem) for swap files, checkpoints and fio's file")
      ->capture_default_str();
  app.add_option("--layers", layers, "Decoder layers of the 350m shape (16: ~2.5 GB saved)")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Interleaved fio / save rounds")->capture_default_str();
  app.add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size")
      ->capture_default_str();
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
    o.optimizer.type = "AdamW";
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
      // What a save reads: every sub-group of the params and both moments from the swap files.
      double read_seconds = 0.0;
      {
        auto& sw = engine.zero_model().optimizer().swapper();
        std::vector<float> buffer;
        const auto t0 = std::chrono::steady_clock::now();
        for (auto state :
             {zinf::offload::OptimizerState::kParams, zinf::offload::OptimizerState::kExpAvg,
              zinf::offload::OptimizerState::kExpAvgSq}) {
          for (size_t g = 0; g < sw.sub_group_count(); ++g) {
            buffer.resize(sw.sub_group_range(g).second);
            sw.read_sub_group(state, g, buffer.data());
          }
        }
        read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const double cpu0 = cpu_seconds();
      const zinf::engine::CheckpointReport saved = engine.save_checkpoint(ckpt, "bench");
      const double save_cpu = cpu_seconds() - cpu0;
      const double fio = fio_write_gbps((fs::path(made) / "fio.dat").string(), saved.bytes);
      const zinf::engine::CheckpointReport loaded = engine.load_checkpoint(ckpt);
      const double ratio = saved.gb_per_second() / fio;
      ratios.push_back(ratio);
      fmt::print(
          "round {}: save {:.2f} GB in {:.2f} s = {:.2f} GB/s | fio write {:.2f} GB/s | ratio "
          "{:.2f} | load {:.2f} s = {:.2f} GB/s | swap read alone {:.2f} GB/s | save CPU {:.2f} "
          "s\n",
          r + 1, static_cast<double>(saved.bytes) / 1e9, saved.seconds, saved.gb_per_second(), fio,
          ratio, loaded.seconds, loaded.gb_per_second(),
          static_cast<double>(saved.bytes) / read_seconds / 1e9, save_cpu);
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
