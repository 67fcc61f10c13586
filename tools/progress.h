// Progress of a long job (`zinf train`): on a terminal, one status line redrawn in place on
// `stream` (a bar, step N/M, loss, tokens/s, elapsed and ETA); elsewhere (a pipe, a log file,
// CI), plain status lines on stdout at the first, every `plain_every`-th and the last step, so
// logs stay readable. Other output goes through
// print(), which clears the bar first and redraws it after.
//
// The ETA is the mean time of the steps after the first (which pays for warm-up: the trace
// record, allocations, page faults) times the steps left.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
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
  // A line of other output (to stdout), kept above the bar.
  void print(const std::string& line);
  // Clears the bar; later output starts on a clean line.
  void finish();

  [[nodiscard]] bool terminal() const noexcept { return terminal_; }
  // Seconds left, from the steps seen so far (nullopt before the second step).
  [[nodiscard]] std::optional<double> eta_seconds() const;
  // The status text for `step` (no bar), e.g. "step 12/200  loss 3.1416  812 tokens/s  0:14 <
  // 3:40".
  [[nodiscard]] std::string status(int64_t step) const;

 private:
  void draw();
  void clear();

  int64_t total_;
  std::FILE* stream_;
  bool terminal_;
  int64_t plain_every_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point first_step_end_;
  int64_t step_ = 0;
  double loss_ = 0.0;
  double tokens_per_second_ = 0.0;
  bool drawn_ = false;
};

// "1:05:03", "4:07", "0:09".
[[nodiscard]] std::string format_duration(double seconds);

}  // namespace zinf::tools
