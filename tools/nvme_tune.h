// `zinf nvme-tune`: finds the `aio` settings that give the best read+write throughput for
// one folder, in fewer runs than DeepSpeed's 64-point grid.
//
// The grid is DeepSpeed's: block size {1M, 8M} × queue depth {32, 128} × overlapped or
// sequential events × batched or single submit × parallelism {1, 2, 4, 8}. The search:
//  1. coarse: block size × parallelism (8 points) with the settings that are best on
//     nearly every drive (queue depth 32, overlapped events, batched submit);
//  2. refine: at the best (block size, parallelism) found, every queue depth × events ×
//     submit combination (7 more points), plus the parallelism neighbours of the best with
//     the best of those (≤ 2 more).
// ≤ 17 runs instead of 64. Each run writes then reads `size` bytes; its score is read GB/s +
// write GB/s. A time budget stops the search early (the best found so far is kept and the
// output says the search was cut short).
//
// Not thread-safe (it owns the disk while it runs).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aio/config.h"

namespace zinf::tools {

struct TuneOptions {
  std::string folder;
  uint64_t size_bytes = uint64_t{1} << 30;  // bytes written and read per run
  double budget_seconds = 600;              // stop starting new runs past this
  aio::BackendKind backend = aio::BackendKind::kIoUring;
  int loops = 1;  // loops per direction per run (median taken)
};

struct TuneRun {
  aio::AioConfig config;
  double read_gb_per_s = 0;   // 10^9 B/s
  double write_gb_per_s = 0;  // 10^9 B/s
  double seconds = 0;         // wall time of the run
  double score() const { return read_gb_per_s + write_gb_per_s; }
};

struct TuneResult {
  std::vector<TuneRun> runs;  // in the order they ran
  TuneRun best;
  int planned_runs = 0;  // coarse + refine points the search would make
  bool budget_exhausted = false;
  static constexpr int kFullGridRuns = 64;
};

// Measures one configuration (real: write+read through AioHandle). Tests pass a model.
using TuneMeasure = std::function<TuneRun(const aio::AioConfig&)>;

// The coarse points, in run order.
std::vector<aio::AioConfig> tune_coarse_points(const TuneOptions& options);
// The refine points around `best` (excluding `best` itself).
std::vector<aio::AioConfig> tune_refine_points(const aio::AioConfig& best);

// Runs the search. `measure` defaults to real I/O on options.folder; `progress` is called
// after each run with (run index from 1, runs planned so far, the run).
TuneResult run_nvme_tune(const TuneOptions& options, TuneMeasure measure = {},
                         const std::function<void(int, int, const TuneRun&)>& progress = {});

}  // namespace zinf::tools
