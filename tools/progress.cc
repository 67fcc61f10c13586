#include "tools/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace zinf::tools {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

Progress::Progress(int64_t total_steps, std::FILE* stream, std::optional<bool> terminal,
                   int64_t plain_every)
    : total_(std::max<int64_t>(total_steps, 1)),
      stream_(stream),
      terminal_(terminal.value_or(isatty(fileno(stream)) != 0)),
      plain_every_(std::max<int64_t>(plain_every, 1)),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

std::optional<double> Progress::eta_seconds() const {
  if (step_ < 2) return std::nullopt;
  const double after_first =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first_step_end_).count();
  const double per_step = after_first / static_cast<double>(step_ - 1);
  return per_step * static_cast<double>(std::max<int64_t>(total_ - step_, 0));
}

std::string Progress::status(int64_t step) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const auto eta = eta_seconds();
  const double tps = tokens_per_second_;  // decimals only where they mean something
  return fmt::format("step {}/{}  loss {:.4f}  {:.{}f} tokens/s  {} < {}", step, total_, loss_, tps,
                     tps < 10    ? 2
                     : tps < 100 ? 1
                                 : 0,
                     format_duration(elapsed), eta ? format_duration(*eta) : std::string("?"));
}

void Progress::update(int64_t step, double loss, double tokens_per_second) {
  step_ = step;
  loss_ = loss;
  tokens_per_second_ = tokens_per_second;
  if (step == 1) first_step_end_ = std::chrono::steady_clock::now();
  if (terminal_) {
    draw();
  } else if (step == 1 || step % plain_every_ == 0 || step == total_) {
    fmt::print("{}\n", status(step));  // with the other log lines, on stdout
    std::fflush(stdout);
  }
}

void Progress::draw() {
  constexpr int kWidth = 24;
  const double done =
      std::clamp(static_cast<double>(step_) / static_cast<double>(total_), 0.0, 1.0);
  const int filled = static_cast<int>(done * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '-');
  // \r, the line, then "erase to end of line" so a shorter line leaves no tail.
  fmt::print(stream_, "\r[{}] {}\x1b[K", bar, status(step_));
  std::fflush(stream_);
  drawn_ = true;
}

void Progress::clear() {
  if (terminal_ && drawn_) {
    fmt::print(stream_, "\r\x1b[K");
    std::fflush(stream_);
  }
}

void Progress::print(const std::string& line) {
  clear();
  std::fflush(stdout);
  fmt::print("{}\n", line);
  std::fflush(stdout);
  if (terminal_ && drawn_) draw();
}

void Progress::finish() {
  clear();
  drawn_ = false;
}

}  // namespace zinf::tools
