#include "tools/interrupt.h"

#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace zinf::tools {
namespace {

// Lock-free, so reading and writing them from a signal handler is safe.
std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};
std::atomic<int> g_kill_at{2};
static_assert(std::atomic<int>::is_always_lock_free);

// signal() and raise() are async-signal-safe.
extern "C" void on_signal(int signal_number) {
  g_signal.store(signal_number, std::memory_order_relaxed);
  const int count = g_count.fetch_add(1, std::memory_order_relaxed) + 1;
  if (count >= g_kill_at.load(std::memory_order_relaxed)) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
  }
}

}  // namespace

InterruptScope::InterruptScope(int kill_at) {
  g_signal.store(0, std::memory_order_relaxed);
  g_count.store(0, std::memory_order_relaxed);
  g_kill_at.store(kill_at < 1 ? 1 : kill_at, std::memory_order_relaxed);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  // No SA_RESTART: a blocking call returns EINTR (which every loop of ours retries) and the
  // flag is seen sooner. The handler itself gives the kill_at-th signal its default action.
  action.sa_flags = 0;
  if (::sigaction(SIGINT, &action, &old_int_) != 0) {
    throw std::runtime_error(
        fmt::format("cannot install the SIGINT handler: {}", std::strerror(errno)));
  }
  if (::sigaction(SIGTERM, &action, &old_term_) != 0) {
    int error = errno;
    ::sigaction(SIGINT, &old_int_, nullptr);
    throw std::runtime_error(
        fmt::format("cannot install the SIGTERM handler: {}", std::strerror(error)));
  }
}

InterruptScope::~InterruptScope() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

int interrupt_signal() noexcept { return g_signal.load(std::memory_order_relaxed); }

int interrupt_count() noexcept { return g_count.load(std::memory_order_relaxed); }

void throw_if_interrupted(const std::string& what) {
  if (int sig = interrupt_signal(); sig != 0) {
    throw Interrupted(sig, fmt::format("{} interrupted", what));
  }
}

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return fmt::format("signal {}", signal_number);
  }
}

void set_interrupt_for_testing(int signal_number) noexcept {
  g_signal.store(signal_number, std::memory_order_relaxed);
  if (signal_number == 0) {
    g_count.store(0, std::memory_order_relaxed);
  } else {
    g_count.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace zinf::tools
