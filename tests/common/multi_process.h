// Multi-rank tests on loopback: a test launches N ranks of its own executable, each running
// one (usually DISABLED_) test case with the torchrun-style variables RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT=<a free port> in its
// environment, and collects each rank's exit status and output.
//
//   if (is_child_rank()) GTEST_SKIP();    // only in tests that must not recurse
//   RanksOptions o; o.world_size = 3; o.test = "GlooChild.DISABLED_Collectives";
//   expect_ranks_passed(run_ranks(o));
//
// A rank's exit status alone does not say its test ran: GoogleTest exits 0 when the filter
// matches no test (a renamed rank body), and so does a library call to exit(0) halfway through.
// rank_passed() therefore also wants the "[       OK ] <test>" line of the very test the rank
// was asked to run, and rank_failed() (for ranks a fault test expects to fail) its
// "[  FAILED  ] <test>" line.
//
// A rank that is still running at the deadline is killed (SIGKILL) and reported with
// timed_out = true; run_ranks never waits longer than the deadline (children are watched
// through pidfds and poll, not by sleeping). Output of each rank goes to a file in a
// temporary directory and is read back into RankResult::output.
//
// Thread safety: run_ranks forks; call it from the test's main thread while no other test
// thread runs.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/temp_dir.h"

extern char** environ;

namespace zinf::testing {

// Set in every rank run_ranks starts.
inline constexpr const char* kChildRankVariable = "ZINF_TEST_CHILD_RANK";

// Whether this process is a rank started by run_ranks.
inline bool is_child_rank() { return std::getenv(kChildRankVariable) != nullptr; }

// A TCP port on 127.0.0.1 for a rendezvous store, free when chosen and reserved for this process.
//
// Binding port 0 and releasing it hands back an ephemeral port, and the kernel hands the same
// ephemeral ports to every other socket that binds port 0 or connects: Gloo's pair listeners
// in a test running beside this one took such a port between its release and the store's bind
// ("Address already in use"). So the port is chosen below the ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), where nothing is handed out implicitly, and
// reserved against the other tests of this machine by binding an abstract Unix socket named
// after it ("@zinf-test-port-N": no file, released by the kernel when this process exits).
inline int free_port() {
  int ephemeral_low = 32768;  // Linux's default, when the range cannot be read
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0;
    if (range >> low) ephemeral_low = low;
  }
  const int first = 10000;
  const int span = ephemeral_low - first;
  if (span <= 0) {
    ADD_FAILURE() << "the ephemeral port range starts at " << ephemeral_low
                  << ": no port in [10000, " << ephemeral_low << ") to reserve";
    return 0;
  }
  static int next = static_cast<int>((static_cast<unsigned>(::getpid()) * 2654435761u) % span);
  for (int tries = 0; tries < span; ++tries) {
    const int port = first + (next++ % span);
    const int lock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lock < 0) {
      ADD_FAILURE() << "socket(AF_UNIX): " << std::strerror(errno);
      return 0;
    }
    sockaddr_un name{};
    name.sun_family = AF_UNIX;
    const std::string tag = "zinf-test-port-" + std::to_string(port);
    std::memcpy(name.sun_path + 1, tag.data(), tag.size());  // sun_path[0] == 0: abstract
    const auto name_length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + tag.size());
    if (::bind(lock, reinterpret_cast<sockaddr*>(&name), name_length) != 0) {
      ::close(lock);  // another test holds this port
      continue;
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      ::close(lock);
      ADD_FAILURE() << "socket: " << std::strerror(errno);
      return 0;
    }
    const int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    if (!bound) {
      ::close(lock);
      continue;
    }
    return port;  // `lock` stays bound until the process exits
  }
  ADD_FAILURE() << "no free TCP port in [" << first << ", " << ephemeral_low << ")";
  return 0;
}

struct RanksOptions {
  int world_size = 2;
  // The ranks to start; empty: all of [0, world_size). Leaving one out makes it "never
  // arrive".
  std::vector<int> ranks;
  // The gtest test each rank runs ("Suite.DISABLED_Name"; disabled tests are allowed).
  std::string test;
  // Every rank is killed when this passes.
  std::chrono::milliseconds deadline{60'000};
  // Extra NAME=VALUE variables for every rank.
  std::vector<std::pair<std::string, std::string>> env;
};

struct RankResult {
  int rank = -1;
  std::string test;     // the test the rank was asked to run (RanksOptions::test)
  bool exited = false;  // exited normally (exit_code is valid)
  int exit_code = -1;
  int signal = 0;          // the signal that ended it, when !exited
  bool timed_out = false;  // still running at the deadline, killed by run_ranks
  double seconds = 0;      // from start to exit
  std::string output;      // stdout and stderr

  // rank_passed(*this) without its reason; see there.
  bool passed() const;
};

// "rank 1 (Suite.Name): exit 1 after 0.53 s" and the rank's output, for failure messages.
inline std::string describe(const RankResult& r) {
  std::ostringstream text;
  text << "rank " << r.rank;
  if (!r.test.empty()) {
    text << " (" << r.test << ")";
  }
  text << ": ";
  if (r.timed_out) {
    text << "killed at the deadline";
  } else if (r.exited) {
    text << "exit " << r.exit_code;
  } else {
    text << "signal " << r.signal;
  }
  text << " after " << r.seconds << " s\n--- output of rank " << r.rank << " ---\n"
       << r.output << "--- end of rank " << r.rank << " ---\n";
  return text.str();
}

// Whether `output` holds GoogleTest's result line `tag` ("[       OK ] ", "[  FAILED  ] ",
// "[  SKIPPED ] ") for `test`: the name followed by " (" (the time) or the end of the line, so
// that "Suite.Name" is not found in the line of "Suite.Name2".
inline bool has_result_line(const std::string& output, const std::string& tag,
                            const std::string& test) {
  const std::string line = tag + test;
  for (size_t at = output.find(line); at != std::string::npos; at = output.find(line, at + 1)) {
    const size_t end = at + line.size();
    if (end == output.size() || output[end] == '\n' || output.compare(end, 2, " (") == 0) {
      return true;
    }
  }
  return false;
}

// Whether a rank may end its test with GTEST_SKIP and still count as passed.
enum class SkipPolicy { kFails, kPasses };

namespace multi_process_internal {

inline constexpr const char* kOkTag = "[       OK ] ";
inline constexpr const char* kFailedTag = "[  FAILED  ] ";
inline constexpr const char* kSkippedTag = "[  SKIPPED ] ";

// A reason for `r.test` naming no single test, or empty.
inline std::string test_name_problem(const std::string& test) {
  if (test.empty()) {
    return "RanksOptions::test is empty";
  }
  if (test.find_first_of("*?:") != std::string::npos || test.find('.') == std::string::npos ||
      test[0] == '-') {
    return "RanksOptions::test \"" + test +
           "\" is a pattern; it must name one test (\"Suite.Name\") for its result line";
  }
  return {};
}

// "rank 1 <why>" and describe(r), as a failed check.
inline ::testing::AssertionResult rank_check_failed(const RankResult& r, const std::string& why) {
  return ::testing::AssertionFailure() << "rank " << r.rank << " " << why << "\n" << describe(r);
}

// Why `r` did not exit normally, or empty.
inline std::string abnormal_end(const RankResult& r) {
  if (r.timed_out) {
    return "was still running at the deadline";
  }
  if (!r.exited && r.signal == 0) {
    return "was not started";
  }
  if (!r.exited) {
    return "was killed by signal " + std::to_string(r.signal);
  }
  return {};
}

}  // namespace multi_process_internal

// Success when rank `r` exited 0 and its output holds the "[       OK ] <r.test>" line (with
// SkipPolicy::kPasses, a "[  SKIPPED ] <r.test>" line does too). Otherwise a failure that says
// which of these did not hold (a rank that exited 0 without the line ran no test, or left it
// early through exit(0)), followed by describe(r).
[[nodiscard]] inline ::testing::AssertionResult rank_passed(const RankResult& r,
                                                            SkipPolicy skip = SkipPolicy::kFails) {
  namespace internal = multi_process_internal;
  if (const std::string why = internal::test_name_problem(r.test); !why.empty()) {
    return internal::rank_check_failed(r, why);
  }
  if (const std::string why = internal::abnormal_end(r); !why.empty()) {
    return internal::rank_check_failed(r, why);
  }
  if (r.exit_code != 0) {
    return internal::rank_check_failed(r, "exited " + std::to_string(r.exit_code));
  }
  if (has_result_line(r.output, internal::kOkTag, r.test)) {
    return ::testing::AssertionSuccess();
  }
  if (has_result_line(r.output, internal::kSkippedTag, r.test)) {
    if (skip == SkipPolicy::kPasses) {
      return ::testing::AssertionSuccess();
    }
    return internal::rank_check_failed(r, "skipped " + r.test);
  }
  return internal::rank_check_failed(
      r, std::string("exited 0 without a \"") + internal::kOkTag + r.test +
             "\" line: no test matched the filter, or the test did not finish");
}

// Success when rank `r` ran its test to a GoogleTest failure: it exited (not killed, not at the
// deadline) with a non-zero status and its output holds the "[  FAILED  ] <r.test>" line. For
// fault tests whose surviving ranks are expected to fail their test; a rank that crashed or
// never ran the test is a failure of this check, followed by describe(r).
[[nodiscard]] inline ::testing::AssertionResult rank_failed(const RankResult& r) {
  namespace internal = multi_process_internal;
  if (const std::string why = internal::test_name_problem(r.test); !why.empty()) {
    return internal::rank_check_failed(r, why);
  }
  if (const std::string why = internal::abnormal_end(r); !why.empty()) {
    return internal::rank_check_failed(r, why + " instead of failing " + r.test);
  }
  if (r.exit_code == 0) {
    return internal::rank_check_failed(r, "exited 0; expected " + r.test + " to fail");
  }
  if (has_result_line(r.output, internal::kFailedTag, r.test)) {
    return ::testing::AssertionSuccess();
  }
  return internal::rank_check_failed(r, "exited " + std::to_string(r.exit_code) + " without a \"" +
                                            internal::kFailedTag + r.test +
                                            "\" line: it did not run the test to its end");
}

inline bool RankResult::passed() const { return static_cast<bool>(rank_passed(*this)); }

// EXPECT_TRUE(rank_passed(r, skip)) for every rank, and at least one rank.
inline void expect_ranks_passed(const std::vector<RankResult>& results,
                                SkipPolicy skip = SkipPolicy::kFails) {
  EXPECT_FALSE(results.empty()) << "no ranks";
  for (const RankResult& r : results) {
    EXPECT_TRUE(rank_passed(r, skip));
  }
}

inline std::vector<RankResult> run_ranks(const RanksOptions& options) {
  using Clock = std::chrono::steady_clock;
  std::vector<int> ranks = options.ranks;
  if (ranks.empty()) {
    for (int i = 0; i < options.world_size; ++i) {
      ranks.push_back(i);
    }
  }
  std::vector<RankResult> results(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    results[i].rank = ranks[i];
    results[i].test = options.test;
  }
  TempDir dir;
  if (!dir.ok()) {
    return results;
  }
  char exe[4096];
  const ssize_t exe_length = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (exe_length <= 0) {
    ADD_FAILURE() << "readlink /proc/self/exe: " << std::strerror(errno);
    return results;
  }
  exe[exe_length] = '\0';
  const int port = free_port();

  // The environment of every rank: ours without launcher variables, plus the rank's own.
  const std::vector<std::string> dropped{
      "RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",   "LOCAL_WORLD_SIZE=",
      "MASTER_ADDR=", "MASTER_PORT=", "TORCHELASTIC_", "OMPI_COMM_WORLD_",
      "SLURM_",       "GTEST_"};
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool drop = false;
    for (const std::string& prefix : dropped) {
      drop = drop || entry.rfind(prefix, 0) == 0;
    }
    if (!drop) {
      base.push_back(entry);
    }
  }
  base.push_back("WORLD_SIZE=" + std::to_string(options.world_size));
  base.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.world_size));
  base.push_back("MASTER_ADDR=127.0.0.1");
  base.push_back("MASTER_PORT=" + std::to_string(port));
  for (const auto& [name, value] : options.env) {
    base.push_back(name + "=" + value);
  }
  const std::string filter = "--gtest_filter=" + options.test;

  const Clock::time_point start = Clock::now();
  std::vector<pid_t> pids(ranks.size(), -1);
  std::vector<int> pidfds(ranks.size(), -1);
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::vector<std::string> env = base;
    env.push_back("RANK=" + std::to_string(ranks[i]));
    env.push_back("LOCAL_RANK=" + std::to_string(ranks[i]));
    env.push_back(std::string(kChildRankVariable) + "=" + std::to_string(ranks[i]));
    std::vector<char*> envp;
    for (std::string& entry : env) {
      envp.push_back(entry.data());
    }
    envp.push_back(nullptr);
    std::string arg0(exe);
    std::string arg2("--gtest_also_run_disabled_tests");
    std::string arg1 = filter;
    char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    const std::string log = dir.file("rank" + std::to_string(ranks[i]) + ".log");
    const pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      break;
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    pids[i] = pid;
    pidfds[i] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfds[i] < 0) {
      ADD_FAILURE() << "pidfd_open: " << std::strerror(errno);
    }
  }

  // Watch the children until all have exited or the deadline passes.
  const Clock::time_point deadline = start + options.deadline;
  size_t running = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    running += pids[i] > 0 ? 1 : 0;
  }
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (pids[i] > 0 && pidfds[i] >= 0) {
        fds.push_back(pollfd{pidfds[i], POLLIN, 0});
        which.push_back(i);
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || fds.empty()) {
      break;
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (ready < 0 && errno != EINTR) {
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      break;
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if ((fds[k].revents & POLLIN) == 0) {
        continue;
      }
      const size_t i = which[k];
      int status = 0;
      if (::waitpid(pids[i], &status, 0) == pids[i]) {
        results[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        results[i].exited = WIFEXITED(status);
        results[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        results[i].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      ::close(pidfds[i]);
      pidfds[i] = -1;
      pids[i] = -1;
      --running;
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (pids[i] > 0) {
      ::kill(pids[i], SIGKILL);
      int status = 0;
      ::waitpid(pids[i], &status, 0);
      results[i].timed_out = true;
      results[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (pidfds[i] >= 0) {
      ::close(pidfds[i]);
    }
    std::ifstream in(dir.file("rank" + std::to_string(ranks[i]) + ".log"));
    std::ostringstream text;
    text << in.rdbuf();
    results[i].output = text.str();
  }
  return results;
}

}  // namespace zinf::testing
