#include "tools/zero_to_fp32.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "aio/pinned_budget.h"
#include "consolidate/checkpoint_plan.h"
#include "consolidate/consolidate_writer.h"
#include "tools/byte_size.h"
#include "tools/progress.h"

namespace zinf::tools {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A byte-count progress bar on a terminal (redrawn at most 10 times a second); nothing
// elsewhere (the summary says what was done).
class ByteProgress {
 public:
  explicit ByteProgress(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO) != 0) {}
  ~ByteProgress() { finish(); }
  ByteProgress(const ByteProgress&) = delete;
  ByteProgress& operator=(const ByteProgress&) = delete;

  void update(uint64_t done, uint64_t total) {
    if (!enabled_ || total == 0) return;
    const Clock::time_point now = Clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double fraction = static_cast<double>(done) / static_cast<double>(total);
    const double elapsed = seconds_since(start_);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
    fmt::print(stderr, "\r[{}{}] {:5.1f}%  {} / {}  {:.2f} GB/s  {} < {}\x1b[K",
               std::string(filled, '#'), std::string(kWidth - filled, '.'), fraction * 100,
               format_bytes(done), format_bytes(total), rate / 1e9, format_duration(elapsed),
               format_duration(rate > 0 ? static_cast<double>(total - done) / rate : -1));
    drawn_ = true;
  }
  void finish() {
    if (drawn_) fmt::print(stderr, "\n");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

}  // namespace

void run_zero_to_fp32(const ZeroToFp32Options& options) {
  const Clock::time_point start = Clock::now();
  const std::optional<consolidate::OutputDType> dtype =
      consolidate::parse_output_dtype(options.dtype);
  if (!dtype)
    throw std::invalid_argument("--dtype must be fp32, bf16 or fp16, not '" + options.dtype + "'");
  consolidate::WriteOptions write;
  write.dtype = *dtype;
  write.format = options.safe_serialization ? consolidate::OutputFormat::kSafetensors
                                            : consolidate::OutputFormat::kTorchBin;
  write.max_shard_bytes = parse_byte_size(options.max_shard_size, "--max-shard-size");
  if (write.max_shard_bytes == 0) throw std::invalid_argument("--max-shard-size must be > 0");
  write.chunk_bytes = parse_byte_size(options.chunk_size, "--chunk-size");
  if (write.chunk_bytes < 4096) throw std::invalid_argument("--chunk-size must be >= 4096");
  if (options.threads < 0) throw std::invalid_argument("--threads must be >= 0");
  write.threads = options.threads > 0
                      ? options.threads
                      : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 8U));

  // Before the checkpoint is read: an earlier export needs --overwrite (write_consolidated
  // checks again, just before it writes).
  if (!options.overwrite) {
    std::vector<std::string> earlier = consolidate::earlier_export_files(options.output_dir);
    if (!earlier.empty()) {
      throw consolidate::EarlierExportError(options.output_dir, std::move(earlier));
    }
  }

  consolidate::PlanOptions plan_options;
  plan_options.tag = options.tag;
  plan_options.exclude_frozen = options.exclude_frozen;
  plan_options.verify_crc = options.verify;
  write.verify_crc = options.verify;
  write.overwrite = options.overwrite;
  const consolidate::CheckpointPlan plan =
      consolidate::read_checkpoint_plan(options.checkpoint_dir, plan_options);
  if (!options.quiet) {
    fmt::print("checkpoint {} (tag {}): ZeRO stage {}{}, world size {}, {} files\n",
               options.checkpoint_dir, plan.tag, plan.stage,
               plan.bf16_zero1 ? " (bf16 ZeRO-1)" : "", plan.world_size, plan.files.size());
    for (const std::string& note : plan.notes) fmt::print("note: {}\n", note);
  }

  ByteProgress progress(!options.quiet);
  write.progress = [&progress](uint64_t done, uint64_t total) { progress.update(done, total); };
  const consolidate::WriteSummary summary =
      consolidate::write_consolidated(plan, options.output_dir, write);
  progress.finish();
  // Said even with --quiet: files of the user's folder went.
  for (const std::string& path : summary.replaced) {
    fmt::print("replaced {} (an earlier export's file, --overwrite)\n", path);
  }
  for (const std::string& path : summary.removed) {
    fmt::print("removed {} (an earlier export's file, --overwrite)\n", path);
  }

  const double seconds = seconds_since(start);
  if (!options.quiet) {
    std::string files;
    for (const std::string& file : summary.files) files += (files.empty() ? "" : ", ") + file;
    fmt::print(
        "wrote {} tensors ({} params, {} aliases) as {}: {} in {:.2f} s ({:.2f} GB/s; "
        "{:.2f} s of it completing the files: fsync), peak RSS {:.1f} MiB; {}\n  {}: {}\n",
        summary.tensors, summary.elements, summary.aliases, options.dtype,
        format_bytes(summary.data_bytes), seconds,
        seconds > 0 ? static_cast<double>(summary.data_bytes) / seconds / 1e9 : 0.0,
        summary.finish_seconds, static_cast<double>(aio::peak_rss_bytes()) / (1 << 20),
        options.verify ? fmt::format("CRC-32 of {} checkpoint records checked",
                                     summary.verified_records + plan.files.size())
                       : std::string("CRC-32s not checked (--no-verify)"),
        options.output_dir, files);
  }
}

void add_zero_to_fp32_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ZeroToFp32Options>();
  CLI::App* cmd = app.add_subcommand(
      "zero-to-fp32",
      "Consolidate a DeepSpeed/zinf ZeRO checkpoint (stages 0-3) into pytorch_model.bin or "
      "model.safetensors (sharded with an index when larger than --max-shard-size)");
  cmd->add_option("checkpoint_dir", o->checkpoint_dir,
                  "Folder holding `latest` and the tag folders")
      ->required();
  cmd->add_option("output_dir", o->output_dir, "Folder to write the weights into")->required();
  cmd->add_option("-t,--tag", o->tag, "Checkpoint tag (default: the one `latest` names)");
  cmd->add_flag("--safe-serialization,--safe_serialization", o->safe_serialization,
                "Write safetensors instead of torch .bin");
  cmd->add_option("--max-shard-size,--max_shard_size", o->max_shard_size,
                  "Largest shard (KB/MB/GB decimal, K/M/G binary)")
      ->capture_default_str();
  cmd->add_flag("--exclude-frozen-parameters,--exclude_frozen_parameters", o->exclude_frozen,
                "Leave out params that do not train");
  cmd->add_option("--dtype", o->dtype, "Output dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Gather/convert threads (0: up to 8)")
      ->capture_default_str();
  cmd->add_option("--chunk-size", o->chunk_size,
                  "Output bytes per work item; threads + 2 of them are in memory")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", o->quiet, "No progress bar or summary");
  cmd->add_flag("--overwrite", o->overwrite,
                "Replace an earlier export in output_dir: its files are replaced or removed (each "
                "named) once the new export is complete; other files are never touched");
  cmd->add_flag("--no-verify{false}", o->verify,
                "Skip the CRC-32 check of the checkpoint records read (on by default)");
  cmd->callback([o, &exit_code] {
    try {
      run_zero_to_fp32(*o);
      exit_code = 0;
    } catch (const consolidate::EarlierExportError& e) {
      std::string names;
      for (const std::string& path : e.files()) {
        names += (names.empty() ? "" : ", ") + std::filesystem::path(path).filename().string();
      }
      fmt::print(stderr,
                 "zinf zero-to-fp32: {}: an earlier export is in the output folder ({}); pass "
                 "--overwrite to replace it (its files go once the new export is complete), or "
                 "choose another folder\n",
                 e.files().front(), names);
      exit_code = 2;
    } catch (const std::invalid_argument& e) {
      // A bad option value (--dtype, --chunk-size, ...): a usage error.
      fmt::print(stderr, "zinf zero-to-fp32: {}\n", e.what());
      exit_code = 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "zinf zero-to-fp32: {}\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace zinf::tools
