// FaultInjector and FaultBackend (see aio/fault_backend.h).
#include "aio/fault_backend.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace zinf::aio {

size_t FaultInjector::add(FaultRule rule) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Entry{std::move(rule)});
  return entries_.size() - 1;
}

void FaultInjector::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

uint64_t FaultInjector::fired(size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return index < entries_.size() ? entries_[index].fired : 0;
}

std::optional<FaultRule> FaultInjector::decide(const Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Entry& entry : entries_) {
    const FaultRule& rule = entry.rule;
    if (rule.op && *rule.op != request.op) continue;
    if (rule.fd >= 0 && rule.fd != request.fd) continue;
    if (!rule.path.empty() && request.path.find(rule.path) == std::string_view::npos) continue;
    const uint64_t end = request.offset + request.bytes;
    if (end <= rule.offset_begin || request.offset >= rule.offset_end) continue;
    if (rule.kind == FaultKind::kShort && request.bytes <= rule.short_bytes) continue;
    const uint64_t number = ++entry.matches;
    if (number < rule.nth) continue;
    if (rule.count != 0 && number >= rule.nth + rule.count) continue;
    ++entry.fired;
    return rule;
  }
  return std::nullopt;
}

void FaultInjector::wait_for_release() {
  std::unique_lock<std::mutex> lock(mutex_);
  released_cv_.wait(lock, [this] { return released_; });
}

void FaultInjector::release_stalls() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
  }
  released_cv_.notify_all();
}

uint64_t FaultInjector::abandoned_requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abandoned_;
}

void FaultInjector::note_abandoned(uint64_t requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_ += requests;
}

FaultBackend::FaultBackend(std::unique_ptr<Backend> inner, std::shared_ptr<FaultInjector> injector)
    : inner_(std::move(inner)),
      injector_(std::move(injector)),
      name_("fault(" + std::string(inner_->name()) + ")") {
  synthetic_staged_.reserve(inner_->capacity());
  synthetic_ready_.reserve(inner_->capacity());
}

FaultBackend::~FaultBackend() {
  if (in_flight_ > 0) injector_->note_abandoned(in_flight_);
}

std::string_view FaultBackend::name() const noexcept { return name_; }

int FaultBackend::prep(const Request& request) {
  const std::optional<FaultRule> rule = injector_->decide(request);
  if (!rule) return inner_->prep(request);
  switch (rule->kind) {
    case FaultKind::kError:
    case FaultKind::kRetry:
      synthetic_staged_.push_back(Completion{request.tag, -static_cast<int64_t>(rule->error)});
      return 0;
    case FaultKind::kShort: {
      Request shortened = request;
      shortened.bytes = rule->short_bytes;
      return inner_->prep(shortened);
    }
    case FaultKind::kDelay:
      pending_delay_ = std::max(pending_delay_, rule->delay);
      return inner_->prep(request);
    case FaultKind::kEngine:
      engine_error_ = rule->error;
      engine_failures_ = std::max<uint32_t>(1, rule->reap_failures);
      return inner_->prep(request);
    case FaultKind::kStall:
      pending_stall_ = true;
      return inner_->prep(request);
  }
  return inner_->prep(request);
}

int FaultBackend::submit() {
  if (pending_delay_.count() > 0) {
    std::this_thread::sleep_for(pending_delay_);
    pending_delay_ = std::chrono::microseconds{0};
  }
  if (pending_stall_) {
    injector_->wait_for_release();
    pending_stall_ = false;
  }
  const int synthetic = static_cast<int>(synthetic_staged_.size());
  synthetic_ready_.insert(synthetic_ready_.end(), synthetic_staged_.begin(),
                          synthetic_staged_.end());
  synthetic_staged_.clear();
  const int rc = inner_->submit();
  const int taken = rc < 0 ? (synthetic > 0 ? synthetic : rc) : rc + synthetic;
  if (taken > 0) in_flight_ += static_cast<uint64_t>(taken);
  return taken;
}

int FaultBackend::reap(std::span<Completion> out, unsigned min_complete) {
  const int rc = reap_inner(out, min_complete);
  if (rc > 0) in_flight_ -= std::min<uint64_t>(in_flight_, static_cast<uint64_t>(rc));
  return rc;
}

int FaultBackend::reap_inner(std::span<Completion> out, unsigned min_complete) {
  if (engine_failures_ > 0) {
    --engine_failures_;
    return -engine_error_;
  }
  size_t n = 0;
  while (n < out.size() && !synthetic_ready_.empty()) {
    out[n++] = synthetic_ready_.back();
    synthetic_ready_.pop_back();
  }
  const unsigned still = min_complete > n ? static_cast<unsigned>(min_complete - n) : 0;
  if (n == out.size()) return static_cast<int>(n);
  if (n > 0 && still == 0) return static_cast<int>(n);
  const int rc = inner_->reap(out.subspan(n), still);
  if (rc < 0) return n > 0 ? static_cast<int>(n) : rc;
  return static_cast<int>(n) + rc;
}

BackendFactory fault_backend_factory(std::shared_ptr<FaultInjector> injector,
                                     BackendFactory inner) {
  return [injector = std::move(injector),
          inner = std::move(inner)](const AioConfig& config) -> std::unique_ptr<Backend> {
    std::unique_ptr<Backend> engine = inner ? inner(config) : make_backend(config);
    return std::make_unique<FaultBackend>(std::move(engine), injector);
  };
}

}  // namespace zinf::aio
