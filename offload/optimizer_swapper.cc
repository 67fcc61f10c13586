#include "offload/optimizer_swapper.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "offload/error.h"

namespace zinf::offload {
namespace {

using optimizer_cpu::DType;

std::vector<OptimizerState> kinds_for(optimizer_cpu::StateArrays states) {
  std::vector<OptimizerState> kinds = {OptimizerState::kParams, OptimizerState::kGrads};
  if (states.exp_avg) kinds.push_back(OptimizerState::kExpAvg);
  if (states.exp_avg_sq) kinds.push_back(OptimizerState::kExpAvgSq);
  return kinds;
}

// Bytes per element of an array: grads in their dtype, everything else fp32.
size_t element_bytes_of(OptimizerState state, const OptimizerSwapperConfig& config) {
  return state == OptimizerState::kGrads ? optimizer_cpu::dtype_size(config.grad_dtype) : 4;
}

// Device kNvme with the grads in host memory: no grad extents, no grad buffers in the sets.
bool host_grads(const OptimizerSwapperConfig& config) {
  return config.device == OffloadDevice::kNvme && config.grads_in_memory;
}

// The first sub-group that may be speculated (config.speculate_window: the last N; 0 or N >=
// the count: every one).
size_t first_speculable(const OptimizerSwapperConfig& config) {
  const size_t n = config.sub_groups.size();
  if (!config.speculate) return n;
  return config.speculate_window == 0 || config.speculate_window >= n ? 0
                                                                      : n - config.speculate_window;
}

// Buffer sets: one sub-group in flight, one more for each pipelined direction (NVMe only).
size_t buffer_sets(const OptimizerSwapperConfig& config) {
  if (config.device != OffloadDevice::kNvme) return 1;
  return 1 + (config.pipeline_read ? 1 : 0) + (config.pipeline_write ? 1 : 0);
}

// The pools' buffer sizes: a sub-group of fp32 elements per state buffer, of 16-bit ones per
// param copy.
uint64_t largest_sub_group(const OptimizerSwapperConfig& config) {
  uint64_t largest = 0;
  for (const uint64_t numel : config.sub_groups) largest = std::max(largest, numel);
  return largest;
}
uint64_t state_buffer_bytes(uint64_t group) { return group * 4; }
uint64_t copy_buffer_bytes(uint64_t group) { return group * 2; }

const char* state_name(OptimizerState state) {
  switch (state) {
    case OptimizerState::kParams:
      return "params";
    case OptimizerState::kGrads:
      return "grads";
    case OptimizerState::kExpAvg:
      return "exp_avg";
    case OptimizerState::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

}  // namespace

// The pinned buffers and the I/O queue of one sub-group in flight, and what the buffers
// hold between steps (the cache). The leases come before the queue: the queue's destructor
// drains its transfers before the buffers go back.
struct OptimizerSwapper::BufferSet {
  std::vector<PinnedBufferPool::Lease> states;  // one per kind, in kinds_ order
  PinnedBufferPool::Lease copy;                 // the 16-bit param copy
  std::unique_ptr<NvmeStore::Queue> queue;
  long holds = -1;          // the sub-group whose arrays the buffers hold, or -1
  std::vector<char> valid;  // per kind: states[k] holds sub-group `holds`'s current values

  void hold(long sub_group) {
    if (holds != sub_group) {
      holds = sub_group;
      std::fill(valid.begin(), valid.end(), 0);
    }
  }
};

OptimizerSwapper::OptimizerSwapper(const OptimizerSwapperConfig& config,
                                   optimizer_cpu::Optimizer& optimizer, NvmeStore* store,
                                   Accelerator* accelerator)
    : config_(config),
      optimizer_(optimizer),
      store_(config.device == OffloadDevice::kNvme ? store : nullptr),
      kinds_(kinds_for(optimizer.state_arrays())) {
  for (const uint64_t numel : config_.sub_groups) {
    if (numel == 0) {
      throw OffloadError(ErrorKind::kConfig, "optimizer swapper: a sub-group of 0 elements");
    }
    SubGroup sg;
    sg.offset = numel_;
    sg.numel = numel;
    sub_groups_.push_back(std::move(sg));
    numel_ += numel;
    largest_ = std::max(largest_, numel);
  }
  if (numel_ == 0) {
    throw OffloadError(ErrorKind::kConfig, "optimizer swapper: the partition has 0 elements");
  }
  if (config_.device == OffloadDevice::kNvme && store == nullptr) {
    throw OffloadError(ErrorKind::kConfig,
                       "offload_optimizer.device is nvme but no swap store was given "
                       "(offload_optimizer.nvme_path)");
  }
  const uint64_t group = largest_;
  const size_t sets = buffer_sets(config_);
  const size_t grads_k = kind_index(OptimizerState::kGrads);
  const bool grads_at_home = host_grads(config_);  // (the grads then need no buffer)
  const size_t per_set = kinds_.size() - (grads_at_home ? 1 : 0);
  if (config_.device == OffloadDevice::kNvme && config_.buffer_count < per_set) {
    throw OffloadError(
        ErrorKind::kConfig,
        "offload_optimizer.buffer_count is " + std::to_string(config_.buffer_count) + " but " +
            std::string(optimizer.name()) + " needs " + std::to_string(per_set) +
            (grads_at_home ? " buffers per sub-group (params and its states)"
                           : " buffers per sub-group (params, grads and its states)"));
  }
  // No destructor runs for a throwing constructor: give back every extent taken so far.
  try {
    if (config_.device == OffloadDevice::kNvme) {
      memory_.resize(kinds_.size());
      if (grads_at_home) {
        memory_[grads_k].resize(numel_ * element_bytes(OptimizerState::kGrads));
      }
      const size_t speculable = first_speculable(config_);
      for (size_t g = 0; g < sub_groups_.size(); ++g) {
        SubGroup& sg = sub_groups_[g];
        sg.extents.reserve(kinds_.size());  // push_back below cannot throw: no id is lost
        for (OptimizerState kind : kinds_) {
          sg.extents.push_back(kind == OptimizerState::kGrads && grads_at_home
                                   ? kNoExtent
                                   : store_->allocate(sg.numel * element_bytes(kind)));
        }
        if (g >= speculable) {
          sg.spare.reserve(kinds_.size());
          for (OptimizerState kind : kinds_) {
            sg.spare.push_back(kind == OptimizerState::kGrads
                                   ? kNoExtent  // the grads have no spare
                                   : store_->allocate(sg.numel * element_bytes(kind)));
          }
        }
      }
      store_->reserve();  // fail now, with the numbers, rather than at the first write
      state_pool_ = std::make_unique<PinnedBufferPool>(sets * per_set, state_buffer_bytes(group),
                                                       accelerator, "optimizer state pool");
      copy_pool_ = std::make_unique<PinnedBufferPool>(sets, copy_buffer_bytes(group), accelerator,
                                                      "param copy pool");
      for (size_t s = 0; s < sets; ++s) {
        auto set = std::make_unique<BufferSet>();
        set->states = state_pool_->acquire(per_set);
        if (grads_at_home) {  // no buffer: the grads are read where they are
          set->states.insert(set->states.begin() + static_cast<std::ptrdiff_t>(grads_k),
                             PinnedBufferPool::Lease{});
        }
        set->copy = copy_pool_->acquire();
        set->valid.assign(kinds_.size(), 0);
        set->queue = make_queue();
        sets_.push_back(std::move(set));
      }
      if (grads_in_sets()) {
        for (size_t s = 0; s < sub_groups_.size(); ++s) {
          sets_[s]->holds = static_cast<long>(s);
        }
      }
    } else {
      for (OptimizerState kind : kinds_) {
        memory_.emplace_back(numel_ * element_bytes(kind));
        undo_.emplace_back(
            config_.speculate && kind != OptimizerState::kGrads ? numel_ * element_bytes(kind) : 0);
      }
      sets_.push_back(std::make_unique<BufferSet>());
      copy_pool_ = std::make_unique<PinnedBufferPool>(sets, copy_buffer_bytes(group), accelerator,
                                                      "param copy pool");
    }
  } catch (...) {
    free_extents();
    throw;
  }
}

OptimizerSwapper::~OptimizerSwapper() { free_extents(); }

OptimizerSwapper::BufferSet* OptimizerSwapper::holder(size_t sub_group) noexcept {
  if (store_ == nullptr) {
    return nullptr;
  }
  BufferSet& set = *sets_[sub_group % sets_.size()];
  return set.holds == static_cast<long>(sub_group) ? &set : nullptr;
}

bool OptimizerSwapper::grads_in_sets() const noexcept {
  return store_ != nullptr && !config_.grads_in_memory && sub_groups_.size() <= sets_.size();
}

bool OptimizerSwapper::in_memory(size_t k) const noexcept {
  return store_ == nullptr || (config_.grads_in_memory && kinds_[k] == OptimizerState::kGrads);
}

std::byte* OptimizerSwapper::memory_at(size_t k, const SubGroup& sg) {
  return memory_[k].data() + sg.offset * element_bytes(kinds_[k]);
}

void OptimizerSwapper::drop_sets() noexcept {
  for (auto& set : sets_) {
    if (set->queue != nullptr) {
      try {
        set->queue->wait();
      } catch (...) {
      }
      set->queue.reset();
    }
    set->holds = -1;
    std::fill(set->valid.begin(), set->valid.end(), 0);
  }
}

void OptimizerSwapper::flush() {
  if (store_ == nullptr) {
    return;
  }
  try {
    for (auto& set : sets_) {
      if (set->queue != nullptr && set->queue->pending() > 0) {
        ScopedTime time(counters_, Counters::Clock::kIoWait);
        set->queue->wait();
      }
    }
  } catch (...) {
    drop_sets();
    throw;
  }
}

void OptimizerSwapper::free_extents() noexcept {
  sets_.clear();  // their queues drain whatever is still in flight first
  if (store_ == nullptr) {
    return;
  }
  for (SubGroup& sg : sub_groups_) {
    for (size_t k = 0; k < sg.spare.size(); ++k) {
      if (kinds_[k] != OptimizerState::kGrads) sg.extents.push_back(sg.spare[k]);
    }
    sg.spare.clear();
    for (ExtentId extent : sg.extents) {
      if (extent == kNoExtent) continue;
      try {
        store_->free(extent);
      } catch (const std::exception& e) {
        // Only an extent with a write in flight can refuse, and the queues have drained;
        // the space is lost to this store until it is destroyed, nothing worse.
        spdlog::warn("zinf offload: optimizer swapper could not return a swap extent: {}",
                     e.what());
      }
    }
    sg.extents.clear();
  }
}

std::unique_ptr<NvmeStore::Queue> OptimizerSwapper::make_queue() {
  std::unique_ptr<NvmeStore::Queue> queue = store_->make_queue();
  if (register_pool_) {
    const std::vector<std::pair<void*, size_t>> ranges = state_pool_->ranges();
    register_pool_ = queue->register_buffers(ranges);
  }
  return queue;
}

size_t OptimizerSwapper::kind_index(OptimizerState state) const {
  for (size_t i = 0; i < kinds_.size(); ++i) {
    if (kinds_[i] == state) {
      return i;
    }
  }
  throw OffloadError(ErrorKind::kUsage,
                     std::string(optimizer_.name()) + " keeps no " + state_name(state) + " array");
}

size_t OptimizerSwapper::element_bytes(OptimizerState state) const {
  return element_bytes_of(state, config_);
}

Footprint OptimizerSwapper::footprint(const OptimizerSwapperConfig& config,
                                      optimizer_cpu::StateArrays states) {
  const std::vector<OptimizerState> kinds = kinds_for(states);
  const uint64_t group = largest_sub_group(config);
  const uint64_t sets = buffer_sets(config);
  Footprint f;
  f.pinned = sets * pinned_allocation(copy_buffer_bytes(group));
  if (config.device != OffloadDevice::kNvme) {
    uint64_t numel = 0;
    for (const uint64_t n : config.sub_groups) numel += n;
    for (OptimizerState kind : kinds) {
      f.host += numel * element_bytes_of(kind, config);
      if (config.speculate && kind != OptimizerState::kGrads) f.host += numel * 4;  // undo
    }
    return f;
  }
  const bool grads_at_home = host_grads(config);
  f.pinned += sets * (kinds.size() - (grads_at_home ? 1 : 0)) *
              pinned_allocation(state_buffer_bytes(group));
  const size_t speculable = first_speculable(config);
  for (size_t g = 0; g < config.sub_groups.size(); ++g) {  // an extent per sub-group and kind
    const uint64_t n = config.sub_groups[g];
    for (OptimizerState kind : kinds) {
      if (kind == OptimizerState::kGrads && grads_at_home) {
        f.host += n * element_bytes_of(kind, config);
        continue;
      }
      const uint64_t extent = swap_extent(n * element_bytes_of(kind, config));
      f.nvme += extent;
      if (g >= speculable && kind != OptimizerState::kGrads) f.nvme += extent;  // the spare
    }
  }
  return f;
}

uint64_t OptimizerSwapper::pinned_bytes() const noexcept {
  uint64_t bytes = copy_pool_->stats().pinned_bytes;
  if (state_pool_) {
    bytes += state_pool_->stats().pinned_bytes;
  }
  return bytes;
}

OffloadCounters OptimizerSwapper::counters() const {
  OffloadCounters c = counters_.snapshot();
  for (const auto* pool : {state_pool_.get(), copy_pool_.get()}) {
    if (pool != nullptr) {
      const PinnedPoolStats stats = pool->stats();
      c.pool_buffers += stats.buffer_count;
      c.pool_high_water += stats.high_water;
      c.pinned_bytes += stats.pinned_bytes;
    }
  }
  return c;
}

void OptimizerSwapper::initialize(const float* params) {
  load_state(OptimizerState::kParams, params);
  for (OptimizerState kind : kinds_) {
    if (kind == OptimizerState::kParams) {
      continue;
    }
    const size_t k = kind_index(kind);
    if (in_memory(k)) {
      std::memset(memory_[k].data(), 0, memory_[k].size());
      continue;
    }
    // Zeros are the value of this array in every sub-group: each set's buffer of it becomes
    // zeros (still valid for the sub-group the set holds), and the first one is written out.
    for (auto& set : sets_) {
      std::memset(set->states[k].data(), 0, set->states[k].size());
      set->valid[k] = 1;
    }
    if (kind == OptimizerState::kGrads && grads_in_sets()) {
      continue;  // the grads live in the sets only
    }
    for (const SubGroup& sg : sub_groups_) {
      store_->write(sg.extents[k], sets_[0]->states[k].data());
      counters_.add_nvme_written(sg.numel * element_bytes(kind));
    }
  }
}

void OptimizerSwapper::load_state(OptimizerState state, const void* data) {
  const size_t k = kind_index(state);
  const size_t bytes = element_bytes(state);
  const auto* src = static_cast<const std::byte*>(data);
  if (in_memory(k)) {
    std::memcpy(memory_[k].data(), src, numel_ * bytes);
    counters_.add_cpu_written(numel_ * bytes);
    return;
  }
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    write_sub_group(state, g, src + sub_groups_[g].offset * bytes);
  }
}

void OptimizerSwapper::read_state(OptimizerState state, void* data) {
  const size_t k = kind_index(state);
  const size_t bytes = element_bytes(state);
  auto* dst = static_cast<std::byte*>(data);
  if (in_memory(k)) {
    std::memcpy(dst, memory_[k].data(), numel_ * bytes);
    counters_.add_cpu_read(numel_ * bytes);
    return;
  }
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    read_sub_group(state, g, dst + sub_groups_[g].offset * bytes);
  }
}

std::pair<uint64_t, uint64_t> OptimizerSwapper::sub_group_range(size_t sub_group) const {
  if (sub_group >= sub_groups_.size()) {
    throw OffloadError(ErrorKind::kUsage, "sub-group " + std::to_string(sub_group) + " of " +
                                              std::to_string(sub_groups_.size()));
  }
  return {sub_groups_[sub_group].offset, sub_groups_[sub_group].numel};
}

bool OptimizerSwapper::has_state(OptimizerState state) const noexcept {
  return std::find(kinds_.begin(), kinds_.end(), state) != kinds_.end();
}

void* OptimizerSwapper::memory(OptimizerState state) {
  const size_t k = kind_index(state);
  return in_memory(k) ? memory_[k].data() : nullptr;
}

void OptimizerSwapper::write_sub_group(OptimizerState state, size_t sub_group, const void* data) {
  const auto [offset, numel] = sub_group_range(sub_group);
  const size_t k = kind_index(state);
  const size_t bytes = element_bytes(state);
  if (in_memory(k)) {
    std::memcpy(memory_[k].data() + offset * bytes, data, numel * bytes);
    counters_.add_cpu_written(numel * bytes);
    return;
  }
  flush();
  const bool grads_kept = state == OptimizerState::kGrads && grads_in_sets();
  if (grads_kept) {
    sets_[sub_group]->hold(static_cast<long>(sub_group));
  }
  if (BufferSet* set = holder(sub_group)) {
    std::memcpy(set->states[k].data(), data, numel * bytes);
    set->valid[k] = 1;
    counters_.add_cpu_written(numel * bytes);
  }
  if (!grads_kept) {
    store_->write(sub_groups_[sub_group].extents[k], data);
    counters_.add_nvme_written(numel * bytes);
  }
}

void OptimizerSwapper::read_sub_group(OptimizerState state, size_t sub_group, void* data) {
  const uint64_t bytes = sub_group_range(sub_group).second * element_bytes(state);
  // (held() refuses the params and states of an undecided speculative update.)
  if (const void* in_memory = held(state, sub_group)) {  // counted as a CPU read there
    std::memcpy(data, in_memory, bytes);
    return;
  }
  store_->read(sub_groups_[sub_group].extents[kind_index(state)], data);
  counters_.add_nvme_read(bytes);
}

const void* OptimizerSwapper::held(OptimizerState state, size_t sub_group) {
  const auto [offset, numel] = sub_group_range(sub_group);
  const size_t k = kind_index(state);
  if (state != OptimizerState::kGrads &&
      sub_groups_[sub_group].state == SubGroupState::kSpeculated) {
    throw OffloadError(ErrorKind::kUsage, std::string(state_name(state)) + " of sub-group " +
                                              std::to_string(sub_group) +
                                              " read while a speculative update is undecided");
  }
  if (in_memory(k)) {
    counters_.add_cpu_read(numel * element_bytes(state));
    return memory_[k].data() + offset * element_bytes(state);
  }
  flush();
  BufferSet* set = holder(sub_group);
  if (set == nullptr || set->valid[k] == 0) {
    return nullptr;
  }
  counters_.add_cpu_read(numel * element_bytes(state));
  return set->states[k].data();
}

void OptimizerSwapper::write_grads(uint64_t offset, const void* grads, uint64_t numel) {
  if (offset > numel_ || numel > numel_ - offset) {
    throw OffloadError(ErrorKind::kUsage, "write_grads of " + std::to_string(numel) +
                                              " elements at " + std::to_string(offset) +
                                              " exceeds the partition of " +
                                              std::to_string(numel_));
  }
  const size_t k = kind_index(OptimizerState::kGrads);
  const size_t bytes = element_bytes(OptimizerState::kGrads);
  const auto* src = static_cast<const std::byte*>(grads);
  if (in_memory(k)) {
    std::memcpy(memory_[k].data() + offset * bytes, src, numel * bytes);
    counters_.add_cpu_written(numel * bytes);
    return;
  }
  flush();
  const uint64_t end = offset + numel;
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    const SubGroup& sg = sub_groups_[g];
    const uint64_t begin = std::max(offset, sg.offset);
    const uint64_t stop = std::min(end, sg.offset + sg.numel);
    if (begin >= stop) {
      continue;
    }
    const std::byte* piece = src + (begin - offset) * bytes;
    const uint64_t at = (begin - sg.offset) * bytes;
    const uint64_t length = (stop - begin) * bytes;
    if (grads_in_sets()) {
      // Kept in the set only. Its grads are invalid only before initialize() or after a
      // failure dropped them: the rest of the sub-group starts at zero then.
      BufferSet& set = *sets_[g];
      set.hold(static_cast<long>(g));
      if (set.valid[k] == 0 && length < sg.numel * bytes) {
        std::memset(set.states[k].data(), 0, sg.numel * bytes);
      }
      std::memcpy(set.states[k].data() + at, piece, length);
      set.valid[k] = 1;
      counters_.add_cpu_written(length);
      continue;
    }
    if (BufferSet* set = holder(g); set != nullptr && set->valid[k] != 0) {
      std::memcpy(set->states[k].data() + at, piece, length);
    }
    store_->write_range(sg.extents[k], at, piece, length);
    counters_.add_nvme_written(length);
  }
}

uint64_t OptimizerSwapper::run_optimizer(const SubGroup& group, void* const* arrays,
                                         void* param_copy, const OptimizerStepOptions& options) {
  optimizer_cpu::StepArgs args;
  for (size_t i = 0; i < kinds_.size(); ++i) {
    switch (kinds_[i]) {
      case OptimizerState::kParams:
        args.params = static_cast<float*>(arrays[i]);
        break;
      case OptimizerState::kGrads:
        args.grads = arrays[i];
        break;
      case OptimizerState::kExpAvg:
        args.exp_avg = arrays[i];
        break;
      case OptimizerState::kExpAvgSq:
        args.exp_avg_sq = arrays[i];
        break;
    }
  }
  args.grad_dtype = config_.grad_dtype;
  args.state_dtype = DType::kFloat32;
  args.numel = group.numel;
  args.grad_scale = options.clip_coefficient / options.loss_scale;
  // fp32: the sink reads the updated master params; no copy in the pass.
  const bool fp32_copy = config_.param_copy_dtype == DType::kFloat32;
  args.param_copy = fp32_copy ? nullptr : param_copy;
  args.param_copy_dtype = fp32_copy ? DType::kBFloat16 : config_.param_copy_dtype;
  args.step = options.step;
  ScopedTime time(counters_, Counters::Clock::kCompute);
  try {
    return optimizer_.step(args).nonfinite_grads;
  } catch (const std::invalid_argument& e) {
    throw OffloadError(ErrorKind::kConfig, std::string("optimizer step: ") + e.what());
  }
}

OptimizerStepReport OptimizerSwapper::step(const OptimizerStepOptions& options,
                                           const ParamCopySink& sink) {
  const auto start = std::chrono::steady_clock::now();
  OptimizerStepReport report;
  for (const SubGroup& sg : sub_groups_) {
    if (sg.state == SubGroupState::kSpeculated) {
      throw OffloadError(ErrorKind::kUsage,
                         "optimizer step with a speculative update neither committed nor rolled "
                         "back");
    }
  }
  struct Plain {  // the committed sub-groups count as plain again once the step has ended
    std::vector<SubGroup>& groups;
    ~Plain() {
      for (SubGroup& sg : groups) sg.state = SubGroupState::kPlain;
    }
  } plain{sub_groups_};
  report.sub_groups = sub_groups_.size();
  if (store_ == nullptr) {
    step_in_memory(options, sink, report);
  } else {
    step_nvme(options, sink, report);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

void OptimizerSwapper::step_in_memory(const OptimizerStepOptions& options,
                                      const ParamCopySink& sink, OptimizerStepReport& report) {
  PinnedBufferPool::Lease copy = copy_pool_->acquire();
  std::vector<void*> arrays(kinds_.size());
  for (const size_t g : step_order()) {
    const SubGroup& sg = sub_groups_[g];
    uint64_t touched = 0;
    for (size_t k = 0; k < kinds_.size(); ++k) {
      arrays[k] = memory_[k].data() + sg.offset * element_bytes(kinds_[k]);
      touched += sg.numel * element_bytes(kinds_[k]);
    }
    void* copy_ptr = !options.copy_params                          ? nullptr
                     : config_.param_copy_dtype == DType::kFloat32 ? arrays[0]
                                                                   : copy.data();
    report.nonfinite_grads += run_optimizer(sg, arrays.data(), copy_ptr, options);
    counters_.add_cpu_read(touched);
    counters_.add_cpu_written(touched - sg.numel * element_bytes(OptimizerState::kGrads));
    if (copy_ptr != nullptr && sink) {
      ScopedTime time(counters_, Counters::Clock::kCompute);
      sink(sg.offset, copy_ptr, sg.numel);
    }
    if (observer_ != nullptr) {
      // The next sub-group's update does not touch these arrays, but step() returns with
      // nothing shown still in use: release at once.
      show(g, arrays.data());
      observer_->release(g);
    }
  }
}

void OptimizerSwapper::show(size_t sub_group, void* const* arrays) const noexcept {
  const void* shown[4] = {nullptr, nullptr, nullptr, nullptr};
  for (size_t k = 0; k < kinds_.size() && k < 4; ++k) {
    shown[k] = kinds_[k] == OptimizerState::kGrads ? nullptr : arrays[k];
  }
  observer_->updated(sub_group, sub_groups_[sub_group].numel, kinds_.data(), shown,
                     std::min<size_t>(kinds_.size(), 4));
}

void OptimizerSwapper::step_nvme(const OptimizerStepOptions& options, const ParamCopySink& sink,
                                 OptimizerStepReport& report) {
  const size_t set_count = sets_.size();
  const std::vector<size_t> order = step_order();
  const size_t n = order.size();
  const size_t grads = kind_index(OptimizerState::kGrads);
  // Sub-group order[j] always passes through its own set, order[j] % set_count (the cache's
  // rule). When a commit left gaps in the order, two neighbours may share a set: the later
  // one's reads then wait for the earlier one's update and writes instead of running ahead.
  auto set_of = [&](size_t j) -> BufferSet& { return *sets_[order[j] % set_count]; };
  auto shares_set = [&](size_t j) { return j + 1 < n && &set_of(j + 1) == &set_of(j); };
  for (auto& set : sets_) {
    if (set->queue == nullptr) {  // closed after a failed step
      set->queue = make_queue();
    }
  }
  auto wait = [&](BufferSet& set) {
    ScopedTime time(counters_, Counters::Clock::kIoWait);
    set.queue->wait();
  };
  // Queue the reads of sub-group i into its set, once that set's previous writes are done.
  // Arrays the set still holds for sub-group i are not read again.
  auto issue_reads = [&](size_t j) {
    BufferSet& set = set_of(j);
    wait(set);
    if (observer_ != nullptr && j >= set_count) {
      // The set's arrays were shown for that sub-group (an observed step has no gaps).
      observer_->release(order[j - set_count]);
    }
    set.hold(static_cast<long>(order[j]));
    const SubGroup& sg = sub_groups_[order[j]];
    for (size_t k = 0; k < kinds_.size(); ++k) {
      if (set.valid[k] != 0 || in_memory(k)) {
        continue;
      }
      set.queue->async_read(sg.extents[k], set.states[k].data());
      set.valid[k] = 1;  // once waited for; a failed read drops every set
      counters_.add_nvme_read(sg.numel * element_bytes(kinds_[k]));
    }
  };
  try {
    std::vector<void*> arrays(kinds_.size());
    if (n > 0) {
      issue_reads(0);
    }
    for (size_t j = 0; j < n; ++j) {
      // Sets of j-1 (writing), j (updating) and j+1 (reading) are distinct in a step without
      // gaps: sets = 1 + pipeline_read + pipeline_write.
      const bool read_ahead = config_.pipeline_read && j + 1 < n && !shares_set(j);
      if (read_ahead) {
        issue_reads(j + 1);
      }
      BufferSet& set = set_of(j);
      wait(set);  // the reads of sub-group order[j]
      const size_t i = order[j];
      const SubGroup& sg = sub_groups_[i];
      for (size_t k = 0; k < kinds_.size(); ++k) {
        arrays[k] = in_memory(k) ? memory_at(k, sg) : set.states[k].data();
      }
      if (in_memory(grads)) {
        counters_.add_cpu_read(sg.numel * element_bytes(OptimizerState::kGrads));
      }
      void* copy_ptr = !options.copy_params                          ? nullptr
                       : config_.param_copy_dtype == DType::kFloat32 ? arrays[0]
                                                                     : set.copy.data();
      set.valid[grads] = 0;  // consumed by this step
      report.nonfinite_grads += run_optimizer(sg, arrays.data(), copy_ptr, options);
      if (copy_ptr != nullptr && sink) {
        ScopedTime time(counters_, Counters::Clock::kCompute);
        sink(sg.offset, copy_ptr, sg.numel);
      }
      if (observer_ != nullptr) {
        show(i, arrays.data());
      }
      for (size_t k = 0; k < kinds_.size(); ++k) {
        if (k == grads) {
          continue;
        }
        set.queue->async_write(sg.extents[k], set.states[k].data());
        counters_.add_nvme_written(sg.numel * element_bytes(kinds_[k]));
      }
      if (!config_.pipeline_write && j + 1 < n) {
        wait(set);
      }
      if (!read_ahead && j + 1 < n) {
        issue_reads(j + 1);
      }
    }
    // Every set's writes but the last sub-group's are waited for here (they were issued
    // earlier and have mostly ended); the last one's run behind the caller's next work.
    for (auto& set : sets_) {
      if (n == 0 || set.get() != &set_of(n - 1)) {
        wait(*set);
      }
    }
    if (observer_ != nullptr && n > 0) {
      ScopedTime time(counters_, Counters::Clock::kIoWait);
      observer_->release(order[n - 1]);
    }
  } catch (...) {
    if (observer_ != nullptr && n > 0) {
      observer_->release(order[n - 1]);  // before anything may reuse the buffers it was shown
    }
    // Let every transfer end before anything reuses the buffers; report the first error.
    // Then close the queues: one that saw an error may hold a broken aio handle (an engine
    // failure fails all its later transfers), so the next step makes fresh ones. What the
    // sets held is dropped: the disk is the only truth after a failed step.
    drop_sets();
    throw;
  }
}

std::vector<size_t> OptimizerSwapper::step_order() const {
  std::vector<size_t> order;
  order.reserve(sub_groups_.size());
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    if (sub_groups_[g].state != SubGroupState::kCommitted) order.push_back(g);
  }
  return order;
}

// ---- speculative updates ------------------------------------------------------------------

bool OptimizerSwapper::can_speculate(size_t sub_group) const noexcept {
  return sub_group < sub_groups_.size() && sub_group >= first_speculable(config_);
}

uint64_t OptimizerSwapper::speculate(size_t sub_group, const void* grads,
                                     const OptimizerStepOptions& options, void* param_copy,
                                     bool keep_grads, const std::function<void()>& grads_taken) {
  if (!can_speculate(sub_group)) {
    throw OffloadError(ErrorKind::kUsage,
                       config_.speculate
                           ? "speculate() of sub-group " + std::to_string(sub_group) +
                                 ", outside the window of the last " +
                                 std::to_string(config_.speculate_window)
                           : std::string("speculate() on a swapper made without speculate"));
  }
  SubGroup& sg = sub_groups_.at(sub_group);
  if (sg.state != SubGroupState::kPlain) {
    throw OffloadError(ErrorKind::kUsage,
                       "sub-group " + std::to_string(sub_group) + " speculated twice in one step");
  }
  const size_t grads_k = kind_index(OptimizerState::kGrads);
  const bool fp32_copy = config_.param_copy_dtype == DType::kFloat32;
  std::vector<void*> arrays(kinds_.size());
  uint64_t nonfinite = 0;
  if (store_ == nullptr) {
    for (size_t k = 0; k < kinds_.size(); ++k) {
      arrays[k] = memory_[k].data() + sg.offset * element_bytes(kinds_[k]);
      if (k != grads_k) {
        std::memcpy(undo_[k].data() + sg.offset * 4, arrays[k], sg.numel * 4);
        counters_.add_cpu_read(sg.numel * 4);
      }
    }
    if (grads_taken) grads_taken();
    sg.state = SubGroupState::kSpeculated;  // the undo is taken: a rollback restores it
    nonfinite = run_optimizer(sg, arrays.data(), fp32_copy ? nullptr : param_copy, options);
    counters_.add_cpu_written(sg.numel * 4 * (kinds_.size() - 1));
  } else {
    BufferSet& set = *sets_[sub_group % sets_.size()];
    auto wait = [&] {
      ScopedTime time(counters_, Counters::Clock::kIoWait);
      set.queue->wait();
    };
    try {
      if (set.queue == nullptr) set.queue = make_queue();
      wait();  // whatever the set still had in flight (a step's last writes, a speculation's)
      set.hold(static_cast<long>(sub_group));
      if (in_memory(grads_k)) {
        counters_.add_cpu_read(sg.numel * element_bytes(OptimizerState::kGrads));
      } else {
        std::memcpy(set.states[grads_k].data(), grads,
                    sg.numel * element_bytes(OptimizerState::kGrads));
        set.valid[grads_k] = 1;
        counters_.add_cpu_written(sg.numel * element_bytes(OptimizerState::kGrads));
      }
      if (grads_taken) grads_taken();
      if (keep_grads && !grads_in_sets() && !in_memory(grads_k)) {
        set.queue->async_write(sg.extents[grads_k], set.states[grads_k].data());
        counters_.add_nvme_written(sg.numel * element_bytes(OptimizerState::kGrads));
      }
      for (size_t k = 0; k < kinds_.size(); ++k) {
        if (in_memory(k)) {
          arrays[k] = memory_at(k, sg);
          continue;
        }
        if (set.valid[k] == 0) {
          set.queue->async_read(sg.extents[k], set.states[k].data());
          set.valid[k] = 1;
          counters_.add_nvme_read(sg.numel * element_bytes(kinds_[k]));
        }
        arrays[k] = set.states[k].data();
      }
      wait();
      sg.state = SubGroupState::kSpeculated;  // from here the set holds speculated values
      nonfinite = run_optimizer(sg, arrays.data(), fp32_copy ? nullptr : param_copy, options);
      for (size_t k = 0; k < kinds_.size(); ++k) {
        if (k == grads_k) continue;
        set.queue->async_write(sg.spare[k], set.states[k].data());
        counters_.add_nvme_written(sg.numel * element_bytes(kinds_[k]));
      }
    } catch (...) {
      drop_sets();
      throw;
    }
  }
  if (fp32_copy) {
    std::memcpy(param_copy, arrays[0], sg.numel * sizeof(float));
  }
  return nonfinite;
}

void OptimizerSwapper::commit_speculation() {
  try {
    flush();  // the spare extents' writes
  } catch (...) {
    rollback_speculation();
    throw;
  }
  const size_t grads_k = kind_index(OptimizerState::kGrads);
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    SubGroup& sg = sub_groups_[g];
    if (sg.state != SubGroupState::kSpeculated) continue;
    for (size_t k = 0; k < sg.spare.size(); ++k) {
      if (k != grads_k) std::swap(sg.extents[k], sg.spare[k]);
    }
    sg.state = SubGroupState::kCommitted;
    if (BufferSet* set = holder(g)) {
      set->valid[grads_k] = 0;  // consumed by the update, as in a plain step
    }
  }
}

size_t OptimizerSwapper::rollback_speculation() {
  size_t undone = 0;
  if (store_ != nullptr) {
    try {
      flush();  // nothing may still write the spare extents or read the buffers
    } catch (const std::exception& e) {
      spdlog::warn("zinf offload: a speculative optimizer write failed and is discarded: {}",
                   e.what());
    }
  }
  const size_t grads_k = kind_index(OptimizerState::kGrads);
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    SubGroup& sg = sub_groups_[g];
    if (sg.state != SubGroupState::kSpeculated) continue;
    ++undone;
    sg.state = SubGroupState::kPlain;
    if (store_ == nullptr) {
      for (size_t k = 0; k < kinds_.size(); ++k) {
        if (k == grads_k) continue;
        std::memcpy(memory_[k].data() + sg.offset * 4, undo_[k].data() + sg.offset * 4,
                    sg.numel * 4);
        counters_.add_cpu_written(sg.numel * 4);
      }
      continue;
    }
    if (BufferSet* set = holder(g)) {  // its params and states are the speculated ones
      for (size_t k = 0; k < kinds_.size(); ++k) {
        if (k != grads_k) set->valid[k] = 0;
      }
    }
  }
  return undone;
}

}  // namespace zinf::offload
