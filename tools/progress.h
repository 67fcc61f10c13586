// Progress of a long job (`zinf train`): on a terminal, one status line redrawn in place on
// `stream` (a bar, step N/M, loss, tokens/s, elapsed and ETA); elsewhere (a pipe, a log file,
// CI), plain status lines on stdout at the first, every `plain_every`-th and the last step, so
// logs stay readable. Other output goes through
// print(), which clears the bar first and redraws it after.
//
// The ETA is the mean time of the steps after the first one this run trains (which pays for
// warm-up: the trace record, allocations, page faults) times the steps left. A resumed run
// (`--load`) starts past step 1: its first step is the first update() it gets.
//
// A long step (many micro-batches) shows its own progress: micro_batch() adds "micro-batch
// i/n" and the step's ETA to the bar, and off a terminal prints a plain line every
// kMicroBatchLineSeconds while a step lasts, so a run is never silent for minutes.
//
// Thread safety: every member may be called from any thread (one mutex); the training loop
// updates it while a signal watcher prints through print().
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

namespace zinf::tools {

// Decimals worth printing for a rate such as tokens/s: 2 below 10, 1 below 100, else none
// (a slow run shows "0.25 tokens/s", not "0 tokens/s").
[[nodiscard]] inline int rate_decimals(double rate) { return rate < 10 ? 2 : rate < 100 ? 1 : 0; }

class Progress {
 public:
  // `stream` is where the bar goes (stderr by default); `terminal`: nullopt detects it.
  Progress(int64_t total_steps, std::FILE* stream = stderr,
           std::optional<bool> terminal = std::nullopt, int64_t plain_every = 10);
  ~Progress();

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Step `step` (1-based) finished with this loss and throughput.
  void update(int64_t step, double loss, double tokens_per_second);
  // `done` of the `total` micro-batches of step `step` (1-based) are finished; 0 when the step
  // begins.
  void micro_batch(int64_t step, int64_t done, int64_t total);
  // Where training is: "step 5 of 60, micro-batch 120 of 20000 (about 0:41 left in the step)".
  [[nodiscard]] std::string position() const;
  // A line of other output (to stdout), kept above the bar.
  void print(const std::string& line);
  // Clears the bar; later output starts on a clean line.
  void finish();

  [[nodiscard]] bool terminal() const noexcept { return terminal_; }
  // Seconds left, from the steps seen so far (nullopt before the second step this run
  // trains).
  [[nodiscard]] std::optional<double> eta_seconds() const;
  // Seconds left in the step in progress, from its micro-batches so far (nullopt before one).
  [[nodiscard]] std::optional<double> step_eta_seconds() const;
  // The status text for `step` (no bar), e.g. "step 12/200  loss 3.1416  812 tokens/s  0:14 <
  // 3:40".
  [[nodiscard]] std::string status(int64_t step) const;

  // Plain lines of a long step's micro-batches are this far apart (off a terminal).
  static constexpr double kMicroBatchLineSeconds = 10.0;

 private:
  void draw();
  void clear();
  [[nodiscard]] std::string status_locked(int64_t step) const;
  [[nodiscard]] std::optional<double> eta_locked() const;
  [[nodiscard]] std::optional<double> step_eta_locked() const;
  [[nodiscard]] std::string micro_text() const;

  mutable std::mutex mutex_;
  int64_t total_;
  std::FILE* stream_;
  bool terminal_;
  int64_t plain_every_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point first_step_end_;
  int64_t step_ = 0;
  // The first step update() got (1, or the step after a resumed checkpoint's), 0 before it.
  int64_t first_step_ = 0;
  double loss_ = 0.0;
  double tokens_per_second_ = 0.0;
  bool drawn_ = false;
  // The step in progress: its micro-batches done of total, and when it started.
  int64_t micro_done_ = 0;
  int64_t micro_total_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  std::chrono::steady_clock::time_point last_plain_line_;
};

// "1:05:03", "4:07", "0:09".
[[nodiscard]] std::string format_duration(double seconds);

}  // namespace zinf::tools
