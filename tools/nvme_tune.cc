#include "tools/nvme_tune.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "tools/interrupt.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

constexpr uint64_t kBlockSizes[] = {uint64_t{1} << 20, uint64_t{8} << 20};
constexpr int kParallelism[] = {1, 2, 4, 8};
constexpr int kQueueDepths[] = {32, 128};

bool same_point(const aio::AioConfig& a, const aio::AioConfig& b) {
  return a.block_size == b.block_size && a.queue_depth == b.queue_depth &&
         a.intra_op_parallelism == b.intra_op_parallelism && a.single_submit == b.single_submit &&
         a.overlap_events == b.overlap_events;
}

TuneRun measure_on_disk(const TuneOptions& options, const aio::AioConfig& config) {
  auto start = std::chrono::steady_clock::now();
  IoJob job;
  job.path = options.folder;
  job.size_bytes = options.size_bytes;
  job.aio = config;
  job.loops = options.loops;
  // The read direction reuses what the write direction wrote; a failed or interrupted write
  // removes the file itself, and the read job removes it in every case.
  job.keep_file = true;
  job.write = true;
  IoJobResult written = run_io_job(job);
  ::sync();  // as the reference tuner does between jobs: nothing dirty carries over
  job.write = false;
  job.keep_file = false;
  IoJobResult read = run_io_job(job);
  ::sync();
  TuneRun run;
  run.config = config;
  run.write_gb_per_s = written.median.gb_per_s;
  run.read_gb_per_s = read.median.gb_per_s;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace

std::vector<aio::AioConfig> tune_coarse_points(const TuneOptions& options) {
  std::vector<aio::AioConfig> points;
  for (uint64_t block : kBlockSizes) {
    for (int parallelism : kParallelism) {
      aio::AioConfig c;
      c.backend = options.backend;
      c.block_size = block;
      c.intra_op_parallelism = parallelism;
      c.queue_depth = kQueueDepths[0];
      c.overlap_events = true;
      c.single_submit = false;
      points.push_back(c);
    }
  }
  return points;
}

std::vector<aio::AioConfig> tune_refine_points(const aio::AioConfig& best) {
  std::vector<aio::AioConfig> points;
  for (int depth : kQueueDepths) {
    for (bool overlap : {true, false}) {
      for (bool single : {false, true}) {
        aio::AioConfig c = best;
        c.queue_depth = depth;
        c.overlap_events = overlap;
        c.single_submit = single;
        if (!same_point(c, best)) points.push_back(c);
      }
    }
  }
  return points;
}

TuneResult run_nvme_tune(const TuneOptions& options, TuneMeasure measure,
                         const std::function<void(int, int, const TuneRun&)>& progress) {
  if (options.budget_seconds <= 0) throw std::invalid_argument("--budget must be positive");
  if (!measure) {
    measure = [&options](const aio::AioConfig& c) { return measure_on_disk(options, c); };
  }
  TuneResult result;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Runs `points` unless the budget would be overrun by the next one (estimated by the
  // slowest run so far). Returns false once the budget stops the search.
  auto run_points = [&](const std::vector<aio::AioConfig>& points) {
    for (const aio::AioConfig& c : points) {
      bool done_before = std::any_of(result.runs.begin(), result.runs.end(),
                                     [&](const TuneRun& r) { return same_point(r.config, c); });
      if (done_before) continue;
      double slowest = 0;
      for (const TuneRun& r : result.runs) slowest = std::max(slowest, r.seconds);
      if (!result.runs.empty() && elapsed() + slowest > options.budget_seconds) {
        result.budget_exhausted = true;
        return false;
      }
      const int index = static_cast<int>(result.runs.size()) + 1;
      if (int sig = interrupt_signal(); sig != 0) {
        throw Interrupted(
            sig, fmt::format("nvme-tune stopped before run {} of {}", index, result.planned_runs));
      }
      TuneRun run;
      try {
        run = measure(c);
      } catch (const Interrupted& e) {
        throw Interrupted(e.signal_number(), fmt::format("nvme-tune stopped in run {} of {}: {}",
                                                         index, result.planned_runs, e.what()));
      }
      run.config = c;
      result.runs.push_back(run);
      if (result.runs.size() == 1 || run.score() > result.best.score()) result.best = run;
      if (progress) progress(static_cast<int>(result.runs.size()), result.planned_runs, run);
    }
    return true;
  };

  std::vector<aio::AioConfig> coarse = tune_coarse_points(options);
  result.planned_runs = static_cast<int>(coarse.size());
  if (!run_points(coarse)) return result;

  std::vector<aio::AioConfig> refine = tune_refine_points(result.best.config);
  result.planned_runs += static_cast<int>(refine.size());
  if (!run_points(refine)) return result;

  // Parallelism neighbours of the winner, with its refined queue/event/submit settings: the
  // coarse stage chose parallelism under default queue settings, which may have biased it.
  std::vector<aio::AioConfig> neighbours;
  const int* begin = std::begin(kParallelism);
  const int* end = std::end(kParallelism);
  const int* at = std::find(begin, end, result.best.config.intra_op_parallelism);
  auto add_neighbour = [&](int parallelism) {
    aio::AioConfig c = result.best.config;
    c.intra_op_parallelism = parallelism;
    neighbours.push_back(c);
  };
  if (at != end && at != begin) add_neighbour(*(at - 1));
  if (at != end && at + 1 != end) add_neighbour(*(at + 1));
  std::erase_if(neighbours, [&](const aio::AioConfig& c) {
    return std::any_of(result.runs.begin(), result.runs.end(),
                       [&](const TuneRun& r) { return same_point(r.config, c); });
  });
  result.planned_runs += static_cast<int>(neighbours.size());
  run_points(neighbours);
  return result;
}

}  // namespace zinf::tools
