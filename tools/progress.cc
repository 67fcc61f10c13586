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
  std::lock_guard lock(mutex_);
  return eta_locked();
}

std::optional<double> Progress::step_eta_seconds() const {
  std::lock_guard lock(mutex_);
  return step_eta_locked();
}

std::optional<double> Progress::eta_locked() const {
  if (first_step_ == 0 || step_ <= first_step_) return std::nullopt;
  const double after_first =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first_step_end_).count();
  const double per_step = after_first / static_cast<double>(step_ - first_step_);
  return per_step * static_cast<double>(std::max<int64_t>(total_ - step_, 0));
}

std::optional<double> Progress::step_eta_locked() const {
  if (micro_done_ < 1 || micro_total_ < 1) return std::nullopt;
  const double in_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  return in_step / static_cast<double>(micro_done_) *
         static_cast<double>(std::max<int64_t>(micro_total_ - micro_done_, 0));
}

std::string Progress::micro_text() const {
  if (micro_total_ < 2 || micro_done_ >= micro_total_) return {};
  const auto eta = step_eta_locked();
  return fmt::format("  micro-batch {}/{} ({} left in the step)", micro_done_, micro_total_,
                     eta ? format_duration(*eta) : std::string("?"));
}

std::string Progress::status(int64_t step) const {
  std::lock_guard lock(mutex_);
  return status_locked(step);
}

std::string Progress::status_locked(int64_t step) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const auto eta = eta_locked();
  const double tps = tokens_per_second_;  // decimals only where they mean something
  return fmt::format("step {}/{}  loss {:.4f}  {:.{}f} tokens/s  {} < {}", step, total_, loss_, tps,
                     tps < 10    ? 2
                     : tps < 100 ? 1
                                 : 0,
                     format_duration(elapsed), eta ? format_duration(*eta) : std::string("?"));
}

std::string Progress::position() const {
  std::lock_guard lock(mutex_);
  const int64_t step = std::min(step_ + 1, total_);
  if (micro_total_ < 2 || micro_done_ >= micro_total_) {
    return fmt::format("step {} of {}", step, total_);
  }
  const auto eta = step_eta_locked();
  return fmt::format(
      "step {} of {}, micro-batch {} of {}{}", step, total_, micro_done_ + 1, micro_total_,
      eta ? fmt::format(" (about {} left in the step)", format_duration(*eta)) : std::string());
}

void Progress::update(int64_t step, double loss, double tokens_per_second) {
  std::lock_guard lock(mutex_);
  step_ = step;
  loss_ = loss;
  tokens_per_second_ = tokens_per_second;
  micro_done_ = micro_total_ = 0;
  if (first_step_ == 0) {
    first_step_ = step;
    first_step_end_ = std::chrono::steady_clock::now();
  }
  if (terminal_) {
    draw();
  } else if (step == first_step_ || step % plain_every_ == 0 || step == total_) {
    fmt::print("{}\n", status_locked(step));  // with the other log lines, on stdout
    std::fflush(stdout);
  }
}

void Progress::micro_batch(int64_t step, int64_t done, int64_t total) {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (done == 0) {  // the step begins
    step_start_ = now;
    last_plain_line_ = now;
  }
  micro_done_ = done;
  micro_total_ = total;
  if (total < 2) return;
  if (terminal_) {
    draw();
  } else if (done < total && std::chrono::duration<double>(now - last_plain_line_).count() >=
                                 kMicroBatchLineSeconds) {
    const auto eta = step_eta_locked();
    fmt::print("step {}/{}: micro-batch {}/{} ({} in the step, {} left)\n", step, total_, done,
               total, format_duration(std::chrono::duration<double>(now - step_start_).count()),
               eta ? format_duration(*eta) : std::string("?"));
    std::fflush(stdout);
    last_plain_line_ = now;
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
  fmt::print(stream_, "\r[{}] {}{}\x1b[K", bar, status_locked(step_), micro_text());
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
  std::lock_guard lock(mutex_);
  clear();
  std::fflush(stdout);
  fmt::print("{}\n", line);
  std::fflush(stdout);
  if (terminal_ && drawn_) draw();
}

void Progress::finish() {
  std::lock_guard lock(mutex_);
  clear();
  drawn_ = false;
}

}  // namespace zinf::tools
