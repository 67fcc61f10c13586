// Helpers for the tools tests that need the system: running the real `zinf` binary as a
// child process (its output captured, a signal sent once its output shows progress), a
// size-limited tmpfs mounted for one test, and a loop device over a temp file.
//
// Mounting and losetup need root (or the capabilities); where they are refused the helper
// says why, and the test skips with that reason. Every wait is bounded by a deadline.
//
// Thread safety: none; one test at a time uses each object.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace zinf::testing {

struct ZinfRun {
  int exit_code = -1;   // -1 unless the child exited normally
  int term_signal = 0;  // the signal that killed the child, 0 if it exited
  bool timed_out = false;
  bool signal_sent = false;
  int signals_sent = 0;
  // Seconds from the last signal sent to the child's end.
  double seconds_after_last_signal = 0.0;
  std::string out;
  std::string err;
};

// One signal to send when `when(stdout so far)` first holds (after the signals before it).
struct SignalTrigger {
  std::function<bool(const std::string&)> when;
  int signal_number = SIGINT;
};

// Runs ZINF_BINARY with `args`, sending each trigger's signal in turn. The child is killed
// (SIGKILL) when it has not ended after `timeout_s`.
inline ZinfRun run_zinf_signals(const std::vector<std::string>& args,
                                const std::vector<SignalTrigger>& triggers, int timeout_s = 120);

// Runs ZINF_BINARY with `args`. When `send_when` is given, `signal_number` is sent to the
// child the first time send_when(stdout so far) is true. The child is killed (SIGKILL) when
// it has not ended after `timeout_s`.
inline ZinfRun run_zinf(const std::vector<std::string>& args,
                        const std::function<bool(const std::string&)>& send_when = {},
                        int signal_number = SIGINT, int timeout_s = 120) {
  std::vector<SignalTrigger> triggers;
  if (send_when) triggers.push_back({send_when, signal_number});
  return run_zinf_signals(args, triggers, timeout_s);
}

inline ZinfRun run_zinf_signals(const std::vector<std::string>& args,
                                const std::vector<SignalTrigger>& triggers, int timeout_s) {
  ZinfRun run;
  std::chrono::steady_clock::time_point last_signal{};
  std::vector<std::string> argv_text = {ZINF_BINARY};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    run.err = std::string("pipe2 failed: ") + std::strerror(errno);
    return run;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    run.err = std::string("fork failed: ") + std::strerror(errno);
    return run;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::array<pollfd, 2> fds = {pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      run.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t got = ::read(fds[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      (i == 0 ? run.out : run.err).append(buffer, static_cast<size_t>(got));
    }
    const auto next = static_cast<size_t>(run.signals_sent);
    if (next < triggers.size() && triggers[next].when(run.out)) {
      ::kill(pid, triggers[next].signal_number);
      run.signal_sent = true;
      ++run.signals_sent;
      last_signal = std::chrono::steady_clock::now();
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.term_signal = WTERMSIG(status);
  if (run.signal_sent) {
    run.seconds_after_last_signal =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_signal).count();
  }
  return run;
}

// A tmpfs of `size_bytes` mounted on an existing folder for the object's lifetime.
class TmpfsMount {
 public:
  TmpfsMount(std::string folder, uint64_t size_bytes) : folder_(std::move(folder)) {
    std::string options = "size=" + std::to_string(size_bytes);
    if (::mount("zinf-test", folder_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why_not_ = "mounting a tmpfs on " + folder_ + " was refused: " + std::strerror(errno) +
                 " (needs root or CAP_SYS_ADMIN)";
    } else {
      mounted_ = true;
    }
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(folder_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool ok() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }
  // Remounts read-only; returns false (and sets why_not) when refused.
  bool remount_read_only() {
    if (::mount("zinf-test", folder_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      why_not_ = std::string("remounting read-only was refused: ") + std::strerror(errno);
      return false;
    }
    return true;
  }

 private:
  std::string folder_;
  bool mounted_ = false;
  std::string why_not_;
};

// A loop device over `backing_file` (losetup -f --show), detached on destruction.
class LoopDevice {
 public:
  explicit LoopDevice(const std::string& backing_file) {
    std::string command = "losetup -f --show '" + backing_file + "' 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
      why_not_ = std::string("popen(losetup) failed: ") + std::strerror(errno);
      return;
    }
    std::string text;
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) text += buffer;
    int status = ::pclose(pipe);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (status != 0 || text.rfind("/dev/", 0) != 0) {
      why_not_ = "losetup is unavailable or refused a loop device: " + text;
      return;
    }
    device_ = text;
  }
  ~LoopDevice() { detach(); }
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;

  bool ok() const { return !device_.empty(); }
  const std::string& device() const { return device_; }
  const std::string& why_not() const { return why_not_; }
  // Detaches the device (its writes are then in the backing file).
  void detach() {
    if (device_.empty()) return;
    std::string command = "losetup -d '" + device_ + "' 2>/dev/null";
    (void)std::system(command.c_str());
    device_.clear();
  }

 private:
  std::string device_;
  std::string why_not_;
};

// `zinf train`'s output: step -> the loss text of its "step N | loss X" line.
inline std::map<int, std::string> loss_lines(const std::string& text) {
  std::map<int, std::string> out;
  static const std::regex line(R"(step (\d+) \| loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = (*it)[2];
  }
  return out;
}

}  // namespace zinf::testing
