#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "offload/footprint.h"
#include "offload/param_swapper.h"
#include "offload/sub_groups.h"
#include "zero/activation_offload.h"
#include "zero/dtype_convert.h"
#include "zero/grad_reducer.h"
#include "zero/param_coordinator.h"
#include "zero/param_store.h"
#include "zero/partitioned_optimizer.h"
#include "zero/tied_grads.h"

namespace zinf::engine {
namespace {

using zero::OffloadTarget;

uint64_t precision_bytes(zero::Precision p) { return zero::dtype_size(zero::compute_dtype(p)); }

}  // namespace

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 10 * 1024) {
    return fmt::format("{} B", bytes);  // exact where two decimals of KiB would round
  }
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

namespace {

// The model's parameters as the layout sees them: the trainable ones (layout order), this
// rank's slices, and which are managed by stage 3's coordinator (used only inside blocks).
struct PlannedLayout {
  std::vector<uint64_t> trainable;  // numels
  std::vector<uint64_t> managed;    // numels of the managed ones, in order
  std::vector<uint64_t> managed_slices;
  uint64_t largest_numel = 0;  // of every parameter, frozen ones included
};

PlannedLayout lay_out(const PlanInputs& in, MemoryPlan& plan) {
  const zero::ZeroConfig& z = in.zero;
  const uint64_t elem = precision_bytes(z.precision);
  const auto wl = static_cast<uint64_t>(z.stage == 0 ? 1 : std::max(in.world_size, 1));
  PlannedLayout l;
  for (const PlanParam& p : in.params) {
    l.largest_numel = std::max(l.largest_numel, p.numel);
    if (!p.trainable) {
      plan.device_resident += p.numel * elem;
      continue;
    }
    if (p.tied_outside) plan.pinned += zero::TiedGradRouter::pinned_bytes(p.numel * elem);
    l.trainable.push_back(p.numel);
    plan.model_numel += p.numel;
    const uint64_t slice = (p.numel + wl - 1) / wl;  // zero/partition.h
    plan.partition_numel += slice;
    if (z.stage == 3 && p.in_block && !p.outside_use) {
      l.managed.push_back(p.numel);
      l.managed_slices.push_back(slice);
    } else {
      plan.device_resident += slice * wl * elem;
    }
  }
  return l;
}

// Stage 3's managed parameters: their slices where offload_param puts them (the param
// swapper's footprint for nvme), and the full tensors the coordinator gathers.
void plan_managed(const PlanInputs& in, const PlannedLayout& l, MemoryPlan& plan) {
  const zero::ZeroConfig& z = in.zero;
  if (l.managed.empty()) return;
  const uint64_t elem = precision_bytes(z.precision);
  uint64_t slices = 0;
  for (const uint64_t s : l.managed_slices) slices += s;
  switch (z.offload_param) {
    case OffloadTarget::kNone:
      plan.device_slices += slices * elem;
      break;
    case OffloadTarget::kCpu:
      for (const uint64_t s : l.managed_slices) plan.pinned += offload::pinned_allocation(s * elem);
      break;
    case OffloadTarget::kNvme: {
      const offload::Footprint f =
          offload::ParamSwapper::footprint(zero::param_swapper_config(z), l.managed_slices);
      plan.pinned += f.pinned;
      plan.nvme += f.nvme;
      break;
    }
  }
  const std::vector<bool> persistent = zero::ParamCoordinator::persistent_params(
      l.managed, z.param_persistence_threshold, z.model_persistence_threshold);
  plan.device_gathered = zero::ParamCoordinator::device_elements_bound(
                             zero::coordinator_config(z), l.managed, persistent, in.world_size,
                             z.offload_param != OffloadTarget::kNone) *
                         elem;
}

// The optimizer's partition: its arrays on the device (offload_optimizer none) or in host
// memory (cpu), or in the swap file (nvme), and its pinned pools.
void plan_optimizer(const PlanInputs& in, MemoryPlan& plan) {
  const zero::ZeroConfig& z = in.zero;
  const offload::SubGroupCut cut = offload::cut_sub_groups(plan.partition_numel, z.sub_group_size);
  const offload::Footprint f =
      zero::PartitionedOptimizer::footprint(z, cut.sizes(), in.optimizer_states);
  plan.pinned += f.pinned;
  plan.nvme += f.nvme;
  if (z.offload_optimizer == OffloadTarget::kNone) {
    plan.device_optimizer = f.host;
  } else {
    plan.host += f.host;
  }
  // zinf.overlap_optimizer: the speculated sub-groups' 16-bit params wait in host memory.
  plan.host += zero::PartitionedOptimizer::overlap_host_bytes(z, cut.sizes());
}

// The saved block inputs and LibTorch's working set; what zinf.activation_offload moves
// off the device.
void plan_activations(const PlanInputs& in, MemoryPlan& plan) {
  const ActivationEstimate& a = in.activations;
  const offload::Footprint f = zero::ActivationOffload::footprint(
      in.zero.activation_offload, a.saved_input_bytes, a.saved_inputs);
  const bool offloaded = a.saved_inputs > 0 && in.zero.activation_offload != OffloadTarget::kNone;
  plan.device_activations = offloaded ? a.working_bytes + f.device : a.total();
  plan.pinned_activations = f.pinned;
  plan.nvme_activations = f.nvme;
  plan.pinned += f.pinned;
  plan.nvme += f.nvme;
}

}  // namespace

// The sum of what each component states it allocates (offload/footprint.h).
MemoryPlan plan_memory(const PlanInputs& in) {
  MemoryPlan plan;
  const PlannedLayout layout = lay_out(in, plan);
  plan_managed(in, layout, plan);
  const offload::Footprint reducer = zero::GradReducer::footprint(
      in.zero, in.world_size, layout.trainable, in.host_reads_device_memory);
  plan.device_buckets = reducer.device;
  plan.pinned += reducer.pinned;
  plan_optimizer(in, plan);
  plan_activations(in, plan);
  plan.host_peak_init = layout.largest_numel * 4 * 2;
  return plan;
}

std::string MemoryPlan::table() const {
  std::string out;
  out += fmt::format(
      "  device   {:>11}  = resident params {} + stage-3 slices {} + gathered {} + "
      "buckets {} + optimizer {} + activations {}\n",
      format_bytes(device_total()), format_bytes(device_resident), format_bytes(device_slices),
      format_bytes(device_gathered), format_bytes(device_buckets), format_bytes(device_optimizer),
      format_bytes(device_activations));
  out += fmt::format(
      "  pinned   {:>11}  (pools, staging buffers, pinned CPU slices{})\n", format_bytes(pinned),
      pinned_activations == 0
          ? std::string()
          : fmt::format("; offloaded activations {}", format_bytes(pinned_activations)));
  out += fmt::format(
      "  host     {:>11}  (in-memory optimizer arrays, unpinned slices; +{} "
      "transient at start-up)\n",
      format_bytes(host), format_bytes(host_peak_init));
  out += fmt::format("  nvme     {:>11}  (swap files{})\n", format_bytes(nvme),
                     nvme_activations == 0 ? std::string()
                                           : fmt::format("; offloaded activations {}",
                                                         format_bytes(nvme_activations)));
  return out;
}

}  // namespace zinf::engine
