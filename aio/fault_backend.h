// Fault injection for the aio layer: a forwarding Backend that makes chosen requests fail,
// come back short, fail once with -EINTR/-EAGAIN, wait, or break the engine, in the spirit of
// LevelDB's fault-injecting Env. Tests (and later the offload layer's tests) plug it into an
// AioHandle through a BackendFactory:
//
//   auto faults = std::make_shared<FaultInjector>();
//   faults->add(FaultRule{.op = Op::kWrite, .path = "b.bin", .kind = FaultKind::kError,
//                         .error = ENOSPC});
//   AioHandle handle(config, fault_backend_factory(faults));
//
// A rule matches a request by op, path (substring of Request::path), fd, and an offset range
// intersecting the request; among the matching requests it fires on numbers
// [nth, nth + count) (1-based, count 0 = every one from nth on).
//
// Thread safety: FaultInjector is thread-safe (one mutex); the workers of one handle share
// it, each through its own FaultBackend, which (like every Backend) is single-threaded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "aio/backend.h"
#include "aio/handle.h"

namespace zinf::aio {

enum class FaultKind : uint8_t {
  kError,   // complete with -error without performing the transfer (EIO, ENOSPC, ...)
  kShort,   // perform only the first short_bytes bytes (no fault when the request is smaller)
  kRetry,   // complete with -error (EINTR or EAGAIN) without performing it; the retry is clean
  kDelay,   // hold the submission of the request for `delay`
  kEngine,  // perform the request, but the next reap() fails with -error: the engine itself
            // broke (the handle tears it down and fails the worker's transfers); with
            // reap_failures > 1 the reaps after it fail too (a transiently failing wait)
  kStall,   // hold the submission of the request until FaultInjector::release_stalls()
            // (a hung device: the worker is blocked, its requests never complete)
};

struct FaultRule {
  std::optional<Op> op{};     // nullopt: reads and writes
  std::string path{};         // substring of Request::path; empty: any file
  int fd = -1;                // -1: any descriptor
  uint64_t offset_begin = 0;  // the request's [offset, offset + bytes) must intersect
  uint64_t offset_end = std::numeric_limits<uint64_t>::max();  // [offset_begin, offset_end)
  uint64_t nth = 1;    // first matching request (1-based) the rule fires on
  uint64_t count = 1;  // how many consecutive matches it fires on; 0 = unlimited
  FaultKind kind = FaultKind::kError;
  int error = EIO;              // kError / kRetry: positive errno to report
  uint32_t short_bytes = 4096;  // kShort: bytes actually transferred (O_DIRECT: keep 4096-aligned)
  std::chrono::microseconds delay{0};  // kDelay
  uint32_t reap_failures = 1;          // kEngine: consecutive reap() calls that fail
};

class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // Adds a rule; returns its index for fired().
  size_t add(FaultRule rule);
  void clear();
  // How many requests rule `index` has altered so far.
  uint64_t fired(size_t index) const;

  // The rule (if any) that alters `request`, counting the match. First added rule wins.
  std::optional<FaultRule> decide(const Request& request);

  // kStall: blocks the calling (worker) thread until release_stalls() has been called.
  void wait_for_release();
  // Lets every stalled and later kStall submission go on.
  void release_stalls();

  // Requests that were submitted and not yet reaped when a FaultBackend was destroyed, over
  // all of them: a correct handle never destroys an engine the kernel still works for.
  uint64_t abandoned_requests() const;
  void note_abandoned(uint64_t requests);

 private:
  struct Entry {
    FaultRule rule;
    uint64_t matches = 0;
    uint64_t fired = 0;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // guarded by mutex_
  std::condition_variable released_cv_;
  bool released_ = false;   // guarded by mutex_
  uint64_t abandoned_ = 0;  // guarded by mutex_
};

// Wraps `inner`, consulting `injector` for every prepped request.
class FaultBackend final : public Backend {
 public:
  FaultBackend(std::unique_ptr<Backend> inner, std::shared_ptr<FaultInjector> injector);
  ~FaultBackend() override;

  std::string_view name() const noexcept override;
  BackendCaps caps() const noexcept override { return inner_->caps(); }
  unsigned capacity() const noexcept override { return inner_->capacity(); }

  int prep(const Request& request) override;
  int submit() override;
  int reap(std::span<Completion> out, unsigned min_complete) override;
  int cancel() override { return inner_->cancel(); }
  int register_files(std::span<const int> fds) override { return inner_->register_files(fds); }
  int register_buffers(std::span<const iovec> buffers) override {
    return inner_->register_buffers(buffers);
  }

 private:
  int reap_inner(std::span<Completion> out, unsigned min_complete);

  const std::unique_ptr<Backend> inner_;
  const std::shared_ptr<FaultInjector> injector_;
  const std::string name_;
  std::vector<Completion> synthetic_staged_;  // injected failures not yet "submitted"
  std::vector<Completion> synthetic_ready_;   // injected failures ready to be reaped
  std::chrono::microseconds pending_delay_{0};
  int engine_error_ = 0;          // kEngine: positive errno the next reap() returns
  uint32_t engine_failures_ = 0;  // kEngine: reap() calls still to fail with engine_error_
  bool pending_stall_ = false;    // kStall: the next submit() waits for release_stalls()
  uint64_t in_flight_ = 0;        // submitted (synthetic included), not yet reaped
};

// A factory building config.backend (or `inner`, when given) wrapped in a FaultBackend.
BackendFactory fault_backend_factory(std::shared_ptr<FaultInjector> injector,
                                     BackendFactory inner = nullptr);

}  // namespace zinf::aio
