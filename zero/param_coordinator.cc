#include "zero/param_coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "zero/error.h"

namespace zinf::zero {
namespace {

constexpr size_t kNoUse = std::numeric_limits<size_t>::max();

// Read, copy and gather windows, in multiples of stage3_prefetch_bucket_size.
constexpr uint64_t kReadWindow = 4;
constexpr uint64_t kCopyWindow = 2;
// Reads ahead reach at least this many blocks of the trace: a block's reads are issued
// while the block two before it computes, so the copy issued one block ahead finds them done.
constexpr size_t kReadBlocks = 2;

}  // namespace

std::vector<bool> ParamCoordinator::persistent_params(const std::vector<uint64_t>& numels,
                                                      uint64_t param_threshold,
                                                      uint64_t model_threshold) {
  std::vector<bool> persistent;
  uint64_t total = 0;
  for (const uint64_t n : numels) {
    const bool small = n <= param_threshold && total + n <= model_threshold;
    if (small) total += n;
    persistent.push_back(small);
  }
  return persistent;
}

// At most the live limit of non-persistent parameters, plus the persistent ones. With
// offloaded slices also the device copies started ahead of use (prefetch_from): every
// non-persistent parameter that begins less than the copy window ahead, so up to that window
// plus one parameter, not yet counted as live. The param pool does not bound them: it limits
// reads ahead only, a copy forces its read (zero/param_store.cc start_copy) and its device
// buffer stays until the parameter is released. The window opens from the second pass on
// (the first records the trace and fetches on demand), so a run of one micro-batch measures
// far less than this. One rank: a copy is the full parameter. Several ranks: a copy is a
// slice (ceil(numel / world) elements, hence + one element per parameter), and a slice stays
// until its all-gather completes, so besides the window's slices the live parameters' slices
// can all be there at once (a block's all-gathers are started together). Without offload the
// slices are resident and only the full parameters come and go.
uint64_t ParamCoordinator::device_elements_bound(const CoordinatorConfig& config,
                                                 const std::vector<uint64_t>& numels,
                                                 const std::vector<bool>& persistent, int world,
                                                 bool offloaded) {
  uint64_t persistent_total = 0, other = 0, largest_other = 0, count_other = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (persistent[i]) {
      persistent_total += numels[i];
    } else {
      other += numels[i];
      largest_other = std::max(largest_other, numels[i]);
      ++count_other;
    }
  }
  if (persistent_total + other == 0) return 0;
  const uint64_t live = std::min(config.max_live_parameters, other) + persistent_total;
  const uint64_t bucket = config.prefetch_bucket_size;
  const uint64_t window =
      offloaded && bucket > 0 ? std::min(other, kCopyWindow * bucket - 1 + largest_other) : 0;
  if (world <= 1) {
    // Never more than every parameter at once.
    return offloaded ? std::min(live + window, other + persistent_total) : 0;
  }
  const auto w = static_cast<uint64_t>(world);
  const uint64_t in_flight = offloaded ? live + window : 0;
  return live + (in_flight + w - 1) / w + std::min(count_other, in_flight);
}

ParamCoordinator::ParamCoordinator(const CoordinatorConfig& config,
                                   std::vector<uint64_t> param_numels,
                                   std::vector<std::vector<size_t>> block_params,
                                   std::vector<bool> persistent, ParamFetcher& fetcher)
    : config_(config), fetcher_(fetcher) {
  if (persistent.size() != param_numels.size()) {
    throw ZeroError(fmt::format("param coordinator: {} persistence flags for {} parameters",
                                persistent.size(), param_numels.size()));
  }
  params_.resize(param_numels.size());
  for (size_t p = 0; p < params_.size(); ++p) {
    params_[p].numel = param_numels[p];
    params_[p].persistent = persistent[p];
  }
  blocks_.reserve(block_params.size());
  for (size_t b = 0; b < block_params.size(); ++b) {
    std::vector<size_t> distinct;
    uint64_t live_needed = 0;
    for (size_t p : block_params[b]) {
      if (p >= params_.size()) {
        throw ZeroError(fmt::format("param coordinator: block {} lists parameter {} of {}", b, p,
                                    params_.size()));
      }
      if (std::find(distinct.begin(), distinct.end(), p) != distinct.end()) {
        continue;
      }
      distinct.push_back(p);
      if (!params_[p].persistent) {
        live_needed += params_[p].numel;
      }
    }
    if (live_needed > config_.max_live_parameters) {
      throw ZeroError(fmt::format(
          "block {} needs {} parameter elements gathered at once, more than "
          "zero_optimization.stage3_max_live_parameters ({}): raise the limit to at least {}",
          b, live_needed, config_.max_live_parameters, live_needed));
    }
    blocks_.push_back(std::move(distinct));
  }
}

const std::vector<size_t>& ParamCoordinator::params_of(size_t block) const {
  if (block >= blocks_.size()) {
    throw ZeroError(fmt::format("param coordinator: block {} of {}", block, blocks_.size()));
  }
  return blocks_[block];
}

void ParamCoordinator::begin_pass(bool record) {
  if (in_pass_) {
    throw ZeroError("param coordinator: begin_pass() while a pass is running");
  }
  in_pass_ = true;
  record_ = record;
  diverged_ = false;
  current_.clear();
  position_ = 0;
}

void ParamCoordinator::raise_level(size_t p, Level level) {
  Param& param = params_[p];
  if (param.level < kRead && level >= kRead) {
    // On demand the read must start whatever the pool says: start_copy waits for it.
    (void)fetcher_.start_read(p);
    param.level = kRead;
  }
  if (param.level < kCopied && level >= kCopied) {
    fetcher_.start_copy(p);
    param.level = kCopied;
  }
  if (param.level < kGathered && level >= kGathered) {
    fetcher_.start_gather(p);
    param.level = kGathered;
    param.available = false;
    param.used = false;
    if (param.persistent) {
      stats_.persistent_elements += param.numel;
    } else {
      stats_.live_elements += param.numel;
      stats_.live_high_water = std::max(stats_.live_high_water, stats_.live_elements);
    }
    stats_.gathered_high_water =
        std::max(stats_.gathered_high_water, stats_.live_elements + stats_.persistent_elements);
  }
}

void ParamCoordinator::gather_now(size_t p, bool prefetch) {
  raise_level(p, kGathered);
  if (prefetch) {
    ++stats_.prefetched;
  } else {
    ++stats_.on_demand;
  }
}

void ParamCoordinator::release_param(size_t p) {
  Param& param = params_[p];
  if (param.level == kNone) {
    return;
  }
  if (param.level == kGathered) {
    if (param.persistent) {
      stats_.persistent_elements -= param.numel;
    } else {
      stats_.live_elements -= param.numel;
    }
  }
  param.level = kNone;
  param.available = false;
  param.used = false;
  param.kept = false;
  fetcher_.release(p);
}

size_t ParamCoordinator::next_use(size_t p, size_t position) const {
  const std::vector<size_t>& uses = params_[p].uses;
  auto it = std::upper_bound(uses.begin(), uses.end(), position);
  return it == uses.end() ? kNoUse : *it;
}

void ParamCoordinator::index_trace() {
  for (Param& param : params_) {
    param.uses.clear();
  }
  elements_before_.assign(trace_.size() + 1, 0);
  for (size_t i = 0; i < trace_.size(); ++i) {
    uint64_t elements = 0;
    for (size_t p : blocks_[trace_[i]]) {
      params_[p].uses.push_back(i);
      if (!params_[p].persistent) {
        elements += params_[p].numel;
      }
    }
    elements_before_[i + 1] = elements_before_[i] + elements;
  }
}

void ParamCoordinator::make_room(uint64_t needed, size_t block) {
  if (stats_.live_elements + needed <= config_.max_live_parameters) {
    return;
  }
  const std::vector<size_t>& own = blocks_[block];
  // Candidates: gathered, non-persistent, not in use, not this block's. Retained (used)
  // ones go before prefetched ones; within each, the farthest next use goes first.
  std::vector<std::pair<std::pair<int, size_t>, size_t>> candidates;
  for (size_t p = 0; p < params_.size(); ++p) {
    const Param& param = params_[p];
    if (param.level != kGathered || param.persistent || param.active > 0 ||
        std::find(own.begin(), own.end(), p) != own.end()) {
      continue;
    }
    const size_t next = replaying() ? next_use(p, position_) : kNoUse;
    candidates.push_back({{param.used ? 0 : 1, kNoUse - next}, p});
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& candidate : candidates) {
    if (stats_.live_elements + needed <= config_.max_live_parameters) {
      break;
    }
    release_param(candidate.second);
  }
}

void ParamCoordinator::enter(size_t block) {
  if (!in_pass_) {
    throw ZeroError("param coordinator: a block was entered outside a pass (begin_pass())");
  }
  const std::vector<size_t>& own = params_of(block);
  const size_t position = current_.size();
  current_.push_back(block);
  if (replaying() && (position >= trace_.size() || trace_[position] != block)) {
    diverged_ = true;
    ++stats_.trace_changes;
    last_warning_ =
        position >= trace_.size()
            ? fmt::format(
                  "stage 3: block {} was entered at trace position {}, after the end of "
                  "the recorded trace ({} entries); fetching on demand for the rest of "
                  "this pass and recording the new order",
                  block, position, trace_.size())
            : fmt::format(
                  "stage 3: block {} was entered at trace position {} where the recorded "
                  "trace has block {}; fetching on demand for the rest of this pass and "
                  "recording the new order",
                  block, position, trace_[position]);
    spdlog::warn("{}", last_warning_);
    // What was prefetched for the old order is of no use now.
    for (size_t p = 0; p < params_.size(); ++p) {
      if (!params_[p].persistent && params_[p].active == 0 && !params_[p].used &&
          params_[p].level != kNone && std::find(own.begin(), own.end(), p) == own.end()) {
        release_param(p);
      }
    }
  }
  position_ = position;

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  uint64_t needed = 0;
  for (size_t p : own) {
    if (!params_[p].persistent && params_[p].level != kGathered) {
      needed += params_[p].numel;
    }
  }
  make_room(needed, block);
  for (size_t p : own) {
    if (params_[p].level != kGathered) {
      gather_now(p, false);
    }
  }
  Clock::duration waited = Clock::now() - start;
  if (replaying()) {
    prefetch_from(position);
  }
  const Clock::time_point wait_start = Clock::now();
  for (size_t p : own) {
    Param& param = params_[p];
    if (!param.available) {
      fetcher_.wait_gathered(p);
      param.available = true;
    }
    param.used = true;
    param.kept = false;
    ++param.active;
  }
  waited += Clock::now() - wait_start;
  stats_.block_wait_seconds += std::chrono::duration<double>(waited).count();
}

void ParamCoordinator::prefetch_from(size_t position) {
  const uint64_t bucket = config_.prefetch_bucket_size;
  if (bucket == 0) {
    return;
  }
  // The read window: 4 buckets, or the next kReadBlocks blocks when they hold more.
  const size_t blocks_end = std::min(trace_.size(), position + 1 + kReadBlocks);
  const uint64_t read_window =
      std::max(kReadWindow * bucket, elements_before_[blocks_end] - elements_before_[position + 1]);
  // The distinct non-persistent parameters ahead, with the elements ahead of each.
  std::vector<std::pair<size_t, uint64_t>> ahead;
  uint64_t elements = 0;
  std::vector<bool> seen(params_.size(), false);
  for (size_t j = position + 1; j < trace_.size() && elements < read_window; ++j) {
    for (size_t p : blocks_[trace_[j]]) {
      if (params_[p].persistent || seen[p]) {
        continue;
      }
      seen[p] = true;
      ahead.push_back({p, elements});
      elements += params_[p].numel;
    }
  }
  // Level 1: reads, as far as pinned buffers allow.
  for (const auto& [p, before] : ahead) {
    if (before >= read_window) {
      break;
    }
    if (params_[p].level >= kRead) {
      continue;
    }
    if (!fetcher_.start_read(p)) {
      break;
    }
    params_[p].level = kRead;
  }
  // Level 2: copies (their reads were issued above, or are issued now).
  for (const auto& [p, before] : ahead) {
    if (before >= kCopyWindow * bucket) {
      break;
    }
    if (params_[p].level < kCopied) {
      raise_level(p, kCopied);
    }
  }
  // Level 3: all-gathers, in trace order, within the live limit.
  for (const auto& [p, before] : ahead) {
    if (before >= bucket) {
      break;
    }
    if (params_[p].level == kGathered) {
      continue;
    }
    if (stats_.live_elements + params_[p].numel > config_.max_live_parameters) {
      break;
    }
    gather_now(p, true);
  }
}

void ParamCoordinator::leave(size_t block) {
  if (!in_pass_) {
    throw ZeroError("param coordinator: a block was left outside a pass");
  }
  for (size_t p : params_of(block)) {
    Param& param = params_[p];
    if (param.active > 0) {
      --param.active;
    }
    if (param.persistent || param.active > 0 || param.level == kNone) {
      continue;
    }
    if (replaying()) {
      const size_t next = next_use(p, position_);
      if (next != kNoUse &&
          elements_before_[next] - elements_before_[position_ + 1] <= config_.max_reuse_distance) {
        ++stats_.retained;
        continue;
      }
      if (next == kNoUse && config_.keep_across_passes && reused_next_pass(p)) {
        param.kept = true;
        ++stats_.kept_for_next_pass;
        continue;
      }
    }
    release_param(p);
  }
  if (replaying()) {
    fetch_next_block(position_ + 1);
  }
}

bool ParamCoordinator::reused_next_pass(size_t p) const {
  const std::vector<size_t>& uses = params_[p].uses;
  if (uses.empty()) {
    return false;
  }
  // The elements used in the rest of this pass and before p's first use in the next one.
  const uint64_t rest = elements_before_[trace_.size()] - elements_before_[position_ + 1];
  return rest + elements_before_[uses.front()] <= config_.max_reuse_distance;
}

void ParamCoordinator::fetch_next_block(size_t position) {
  if (config_.prefetch_bucket_size == 0 || position >= trace_.size()) {
    return;
  }
  const size_t block = trace_[position];
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  uint64_t needed = 0;
  for (size_t p : blocks_[block]) {
    if (!params_[p].persistent && params_[p].level != kGathered) {
      needed += params_[p].numel;
    }
  }
  // The room entering the block would make, made now.
  make_room(needed, block);
  if (stats_.live_elements + needed <= config_.max_live_parameters) {
    for (size_t p : blocks_[block]) {
      if (params_[p].level != kGathered) {
        gather_now(p, true);
      }
    }
  }
  stats_.block_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void ParamCoordinator::end_pass() {
  if (!in_pass_) {
    throw ZeroError("param coordinator: end_pass() without begin_pass()");
  }
  in_pass_ = false;
  if (!record_) {
    for (size_t p = 0; p < params_.size(); ++p) {
      params_[p].active = 0;
      if (!params_[p].persistent) {
        release_param(p);
      }
    }
    record_ = true;
    return;
  }
  ++stats_.passes;
  if (replay_ && !diverged_ && current_.size() != trace_.size()) {
    ++stats_.trace_changes;
    // A longer pass diverged in enter(): this one is shorter, and the first differing block
    // is the recorded one that did not come.
    last_warning_ = fmt::format(
        "stage 3: the pass ended after {} block entries where the recorded trace has block {} "
        "at trace position {} ({} entries); recording the new order",
        current_.size(), trace_[current_.size()], current_.size(), trace_.size());
    spdlog::warn("{}", last_warning_);
    diverged_ = true;
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    params_[p].active = 0;
    if (!params_[p].persistent && !(params_[p].kept && !diverged_)) {
      release_param(p);
    }
  }
  if (!replay_ || diverged_) {
    trace_ = current_;
    index_trace();
    replay_ = true;
  }
  diverged_ = false;
}

void ParamCoordinator::release_all() {
  for (size_t p = 0; p < params_.size(); ++p) {
    release_param(p);
  }
}

void ParamCoordinator::reset() noexcept {
  for (size_t p = 0; p < params_.size(); ++p) {
    try {
      release_param(p);
    } catch (...) {
      params_[p].level = kNone;
      params_[p].available = false;
    }
    params_[p].active = 0;
    params_[p].used = false;
    params_[p].kept = false;
  }
  stats_.live_elements = 0;
  stats_.persistent_elements = 0;
  in_pass_ = false;
  diverged_ = false;
  current_.clear();
}

}  // namespace zinf::zero
