// `zinf io` and `zinf nvme-tune`: parsing, printing, exit codes.

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "aio/backend.h"
#include "aio/error.h"
#include "engine/config/run_config.h"
#include "tools/aio_config_json.h"
#include "tools/byte_size.h"
#include "tools/commands.h"
#include "tools/interrupt.h"
#include "tools/io_job.h"
#include "tools/nvme_tune.h"

namespace zinf::tools {
namespace {

// Options shared by both commands, as text until the callback validates them, so that an
// error can name the option the user typed.
struct AioFlags {
  std::string block_size = "1M";
  int queue_depth = 8;
  int parallelism = 1;
  bool single_submit = false;
  bool sequential_requests = false;
  std::string backend = "io_uring";
};

void add_aio_flags(CLI::App* cmd, AioFlags& f, bool with_grid_flags) {
  if (with_grid_flags) {
    cmd->add_option("--block-size,--block_size", f.block_size,
                    "Bytes per request (K/M/G binary suffixes)")
        ->capture_default_str();
    cmd->add_option("--queue-depth,--queue_depth", f.queue_depth, "Requests in flight per thread")
        ->capture_default_str();
    cmd->add_option("--io-parallel,--io_parallel,--intra-op-parallelism", f.parallelism,
                    "Threads one transfer is split over")
        ->capture_default_str();
    cmd->add_flag("--single-submit,--single_submit", f.single_submit,
                  "Submit requests one at a time instead of in batches");
    cmd->add_flag("--sequential-requests,--sequential_requests", f.sequential_requests,
                  "Wait for each batch to complete before submitting more (overlap_events=false)");
  }
  cmd->add_option("--backend", f.backend, "io_uring, libaio or psync")->capture_default_str();
}

aio::AioConfig to_config(const AioFlags& f) {
  aio::AioConfig c;
  c.block_size = parse_byte_size(f.block_size, "--block-size");
  if (c.block_size == 0 || c.block_size % 4096 != 0) {
    throw std::invalid_argument(
        fmt::format("--block-size: {} is not a positive multiple of 4096 bytes", c.block_size));
  }
  if (c.block_size > aio::kMaxRequestBytes) {
    throw std::invalid_argument(
        fmt::format("--block-size: {} is above the largest request the aio engine submits ({})",
                    format_bytes(c.block_size), format_bytes(aio::kMaxRequestBytes)));
  }
  if (f.queue_depth < 1 || f.queue_depth > 4096) {
    throw std::invalid_argument(
        fmt::format("--queue-depth: {} is not in [1, 4096]", f.queue_depth));
  }
  if (f.parallelism < 1 || f.parallelism > 256) {
    throw std::invalid_argument(fmt::format("--io-parallel: {} is not in [1, 256]", f.parallelism));
  }
  c.queue_depth = f.queue_depth;
  c.intra_op_parallelism = f.parallelism;
  c.single_submit = f.single_submit;
  c.overlap_events = !f.sequential_requests;
  auto kind = aio::parse_backend(f.backend);
  if (!kind) {
    throw std::invalid_argument(
        fmt::format("--backend: '{}' is not one of io_uring, libaio, psync", f.backend));
  }
  c.backend = *kind;
  c.validate();
  return c;
}

std::string describe(const aio::AioConfig& c) {
  return fmt::format("block {}, queue depth {}, parallelism {}, {} submit, {} events",
                     format_bytes(c.block_size), c.queue_depth, c.intra_op_parallelism,
                     c.single_submit ? "single" : "batched",
                     c.overlap_events ? "overlapped" : "sequential");
}

// Runs `body`, turning the errors a user can cause into one line on stderr: exit code 2 for a
// usage or config error (a bad value, a path that cannot be used, a config file the tuner
// refuses, a job the target's filesystem has no room for), 1 for a run-time failure (an I/O
// error); SIGINT/SIGTERM into one line saying what was interrupted and exit code 128 + signal
// (the body has drained its I/O and removed its temporary files on the way out).
void guarded(int& exit_code, const std::function<void()>& body) {
  try {
    InterruptScope interrupts;
    body();
    exit_code = 0;
  } catch (const Interrupted& e) {
    fmt::print(stderr, "zinf: interrupted by {}: {}\n", signal_name(e.signal_number()), e.what());
    exit_code = 128 + e.signal_number();
  } catch (const aio::IoError& e) {
    fmt::print(stderr, "zinf: I/O error: {}\n", e.what());
    exit_code = 1;
  } catch (const NotEnoughSpace& e) {
    fmt::print(stderr, "zinf: {}\n", e.what());
    exit_code = 2;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "zinf: {}\n", e.what());
    exit_code = 2;
  } catch (const config::ConfigError& e) {
    fmt::print(stderr, "zinf: {}\n", e.what());
    exit_code = 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zinf: {}\n", e.what());
    exit_code = 1;
  }
}

struct IoOptions {
  std::string path;
  std::string size = "1G";
  bool read = false;
  bool write = false;
  int loops = 3;
  bool validate = false;
  bool json = false;
  bool keep = false;
  bool overwrite = false;
  bool no_fixed_buffers = false;
  AioFlags aio;
};

// What the header says about the file: whose it is and what happens to it.
std::string describe_target(const IoJob& job, const IoPlan& plan) {
  switch (plan.target) {
    case IoPlan::Target::kBlockDevice:
      return fmt::format("block device of {}", format_bytes(plan.existing_bytes));
    case IoPlan::Target::kFile:
      if (plan.in_folder) {
        return job.keep_file ? "zinf's own file (kept afterwards: --keep)"
                             : "zinf's own file (removed afterwards)";
      }
      return fmt::format("existing file of {}", format_bytes(plan.existing_bytes));
    case IoPlan::Target::kNewFile:
      if (plan.in_folder) {
        return job.keep_file ? "created (kept afterwards: --keep)" : "created, removed afterwards";
      }
      return "does not exist: created, and kept afterwards";
  }
  return "";
}

void run_io_command(const IoOptions& o) {
  IoJob job;
  job.path = o.path;
  job.size_bytes = parse_byte_size(o.size, "--size");
  job.write = !o.read;
  job.aio = to_config(o.aio);
  job.loops = o.loops;
  job.validate = o.validate;
  job.keep_file = o.keep;
  job.overwrite = o.overwrite;
  job.register_buffer = !o.no_fixed_buffers;
  // Every check before the header: a bad value never follows a half-printed table.
  const IoPlan plan = plan_io_job(job);

  if (!o.json) {
    fmt::print("zinf io: {} {} ({} bytes), {} loop{}\n", job.write ? "write" : "read",
               format_bytes(job.size_bytes), job.size_bytes, job.loops, job.loops == 1 ? "" : "s");
    fmt::print("  backend {}, {}\n", aio::to_string(job.aio.backend), describe(job.aio));
    fmt::print("  file {}: {}{}\n", plan.file, describe_target(job, plan),
               plan.prepare ? "; the test pattern is written into it first (untimed)" : "");
    fmt::print("  pinned {} ({} buffer{} of up to {} = block x queue depth x threads){}\n",
               format_bytes(plan.ring_bytes), plan.ring_slots, plan.ring_slots == 1 ? "" : "s",
               format_bytes(plan.chunk_bytes),
               plan.ring_holds_all ? ""
               : job.validate
                   ? "; --size streams through them, and --validate's pattern is generated and "
                     "checked inside the timed loops"
                   : "; --size streams through them");
    fmt::print("  {:>6} {:>10} {:>9} {:>9}\n", "loop", "seconds", "GB/s", "GiB/s");
    std::fflush(stdout);
  }
  IoJobResult r = run_io_job(job, [&](int i, const IoLoop& l) {
    if (!o.json) {
      fmt::print("  {:>6} {:>10.4f} {:>9.3f} {:>9.3f}\n", i + 1, l.seconds, l.gb_per_s,
                 l.gib_per_s);
      std::fflush(stdout);
    }
  });
  if (o.json) {
    nlohmann::ordered_json out;
    out["op"] = job.write ? "write" : "read";
    out["file"] = r.file;
    out["bytes"] = job.size_bytes;
    out["direct_io"] = r.direct_io;
    out["aio"] = aio_config_to_json(job.aio);
    out["loops"] = nlohmann::ordered_json::array();
    for (const IoLoop& l : r.loops) {
      out["loops"].push_back(
          {{"seconds", l.seconds}, {"gb_per_s", l.gb_per_s}, {"gib_per_s", l.gib_per_s}});
    }
    out["median"] = {{"seconds", r.median.seconds},
                     {"gb_per_s", r.median.gb_per_s},
                     {"gib_per_s", r.median.gib_per_s}};
    out["created_file"] = r.created_file;
    out["prepared_file"] = r.prepared_file;
    out["pinned_bytes"] = r.pinned_bytes;
    out["validated"] = r.validated;
    out["fixed_buffer"] = r.registered_buffer;
    out["requests"] = r.stats.requests;
    out["fixed_requests"] = r.stats.fixed_requests;
    out["units"] = "GB = 10^9 bytes, GiB = 2^30 bytes";
    std::cout << out.dump(2) << "\n";
    return;
  }
  fmt::print("  {:>6} {:>10.4f} {:>9.3f} {:>9.3f}\n", "median", r.median.seconds, r.median.gb_per_s,
             r.median.gib_per_s);
  fmt::print("  file {}: {}{}{}\n", r.file,
             r.direct_io ? "O_DIRECT"
                         : "buffered (the filesystem refused O_DIRECT: figures "
                           "include the page cache)",
             r.prepared_file ? "; written once before the timed reads" : "",
             r.validated ? "; validated: every byte matched" : "");
  fmt::print("  {} requests, {} through a registered (io_uring fixed) buffer\n", r.stats.requests,
             r.stats.fixed_requests);
  fmt::print("  GB = 10^9 bytes, GiB = 2^30 bytes\n");
}

struct TuneFlags {
  std::string folder;
  std::string size = "1G";
  double budget_s = 600;
  int loops = 1;
  std::string write_config;
  bool create = false;
  AioFlags aio;
};

void run_tune_command(const TuneFlags& f) {
  TuneOptions options;
  options.folder = f.folder;
  options.size_bytes = parse_byte_size(f.size, "--size");
  options.budget_seconds = f.budget_s;
  options.loops = f.loops;
  auto kind = aio::parse_backend(f.aio.backend);
  if (!kind)
    throw std::invalid_argument(
        fmt::format("--backend: '{}' is not one of io_uring, libaio, psync", f.aio.backend));
  options.backend = *kind;
  std::error_code ec;
  if (!std::filesystem::is_directory(options.folder, ec)) {
    throw std::invalid_argument(fmt::format("{}: not a folder", options.folder));
  }
  if (options.loops < 1) throw std::invalid_argument("--loops must be at least 1");
  if (f.create && f.write_config.empty()) {
    throw std::invalid_argument("--create goes with --write-config FILE");
  }
  // The config file is checked before the first run: a typo must not cost a tuning session.
  if (!f.write_config.empty()) {
    for (const std::string& w : check_config_for_aio_block(f.write_config, f.create)) {
      fmt::print(stderr, "zinf: warning: {}\n", w);
    }
  }

  fmt::print("zinf nvme-tune: {} written and read per run in {}, backend {}, budget {:.0f} s\n",
             format_bytes(options.size_bytes), options.folder, aio::to_string(options.backend),
             options.budget_seconds);
  TuneResult r = run_nvme_tune(options, {}, [](int i, int planned, const TuneRun& run) {
    fmt::print(
        "  [{:>2}/{:>2}] {:<72} write {:6.3f} GB/s  read {:6.3f} GB/s  sum {:6.3f}  ({:.1f} s)\n",
        i, planned, describe(run.config), run.write_gb_per_s, run.read_gb_per_s, run.score(),
        run.seconds);
    std::fflush(stdout);
  });
  fmt::print("{} runs (the full grid is {} runs){}\n", r.runs.size(), TuneResult::kFullGridRuns,
             r.budget_exhausted ? "; the time budget cut the search short: best so far below" : "");
  fmt::print("best: {}: write {:.3f} GB/s, read {:.3f} GB/s (GB = 10^9 bytes)\n",
             describe(r.best.config), r.best.write_gb_per_s, r.best.read_gb_per_s);
  nlohmann::ordered_json block;
  block["aio"] = aio_config_to_json(r.best.config);
  fmt::print("{}\n", block.dump(2));
  if (!f.write_config.empty()) {
    write_aio_block(f.write_config, r.best.config, f.create);
    fmt::print("wrote the aio block into {}\n", f.write_config);
  }
}

}  // namespace

void add_io_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<IoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "io", "Measure read or write throughput of a file or folder through zinf's aio engine");
  cmd->add_option("path", o->path, "File, or folder (zinf-io.dat is used inside it)")->required();
  cmd->add_option("--size,--io_size", o->size, "Bytes per loop (K/M/G binary, KB/MB/GB decimal)")
      ->capture_default_str();
  auto* read = cmd->add_flag("--read", o->read, "Measure reads");
  auto* write = cmd->add_flag("--write", o->write, "Measure writes (the default)");
  read->excludes(write);
  cmd->add_option("--loops", o->loops, "Timed loops")->capture_default_str();
  cmd->add_flag("--validate", o->validate,
                "Write a pattern, read it back and compare every byte (on an existing file or "
                "device: needs --overwrite)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_flag("--keep", o->keep, "Keep zinf-io.dat when a folder was given");
  cmd->add_flag("--overwrite", o->overwrite,
                "Allow writing into an existing file or block device (a write job, or a read "
                "with --validate, which writes its pattern first)");
  cmd->add_flag("--no-fixed-buffers", o->no_fixed_buffers,
                "Do not register the buffer with io_uring (to measure what registration gives)");
  add_aio_flags(cmd, o->aio, true);
  cmd->callback([o, &exit_code] { guarded(exit_code, [&] { run_io_command(*o); }); });
}

void add_nvme_tune_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand(
      "nvme-tune", "Find the aio settings with the best read+write throughput for a folder");
  cmd->add_option("folder", f->folder, "Folder on the drive to tune (e.g. the nvme_path)")
      ->required();
  cmd->add_option("--size", f->size, "Bytes written and read per configuration")
      ->capture_default_str();
  cmd->add_option("--budget", f->budget_s, "Seconds after which no new configuration starts")
      ->capture_default_str();
  cmd->add_option("--loops", f->loops, "Timed loops per direction per configuration")
      ->capture_default_str();
  cmd->add_option("--write-config", f->write_config,
                  "Config file whose aio block is replaced with the best settings (checked "
                  "before the first run; only the block's text changes)");
  cmd->add_flag("--create", f->create, "With --write-config: create FILE if it does not exist");
  add_aio_flags(cmd, f->aio, false);
  cmd->callback([f, &exit_code] { guarded(exit_code, [&] { run_tune_command(*f); }); });
}

}  // namespace zinf::tools
