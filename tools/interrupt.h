// Clean ends on SIGINT and SIGTERM for the CLI's commands.
//
// While an InterruptScope lives, SIGINT and SIGTERM only set a process-wide flag (the
// handler does nothing else: it is async-signal-safe). Long-running work polls it between
// requests or loops with throw_if_interrupted(), which throws Interrupted; the code that
// catches it has drained its in-flight I/O and removed its temporary files on the way out
// (RAII), and the command ends with exit code 128 + signal and one line. The signals are
// counted: the `kill_at`-th (2 by default) ends the process at once with the signal's default
// action, for the case where the earlier ones cannot be honoured (a request that never
// completes). `zinf train` takes 3: the second abandons the step in progress.
//
// Thread safety: interrupt_signal() and throw_if_interrupted() may be called from any
// thread. Only one InterruptScope may live at a time (the CLI runs one command).
#pragma once

#include <signal.h>

#include <stdexcept>
#include <string>

namespace zinf::tools {

// Thrown by throw_if_interrupted(); what() says what was interrupted.
class Interrupted : public std::runtime_error {
 public:
  Interrupted(int signal_number, const std::string& what)
      : std::runtime_error(what), signal_number_(signal_number) {}
  int signal_number() const noexcept { return signal_number_; }

 private:
  int signal_number_;
};

// Installs the SIGINT and SIGTERM handlers (clearing the flag) and restores the previous
// ones on destruction. Throws std::runtime_error when sigaction fails.
class InterruptScope {
 public:
  explicit InterruptScope(int kill_at = 2);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The signal received since the scope was entered, or 0.
[[nodiscard]] int interrupt_signal() noexcept;

// How many SIGINT / SIGTERM were received since the scope was entered.
[[nodiscard]] int interrupt_count() noexcept;

// Throws Interrupted(signal, `what` + " interrupted") when a signal was received.
void throw_if_interrupted(const std::string& what);

// "SIGINT", "SIGTERM", or "signal N".
[[nodiscard]] std::string signal_name(int signal_number);

// For tests: behave as if `signal_number` had been received once more (0 clears the flag
// and the count).
void set_interrupt_for_testing(int signal_number) noexcept;

}  // namespace zinf::tools
