#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "offload/cpu_tier_budget.h"
#include "offload/sub_groups.h"

namespace zinf::engine {
namespace {

using zero::OffloadTarget;

constexpr uint64_t kPage = 4096;

uint64_t round_page(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

uint64_t precision_bytes(zero::Precision p) { return p == zero::Precision::kFloat32 ? 4 : 2; }

uint64_t comm_bytes(const zero::ZeroConfig& z) {
  const std::string& t = z.communication_data_type;
  if (t == "fp32" || t == "float32" || t == "float") return 4;
  if (!t.empty()) return 2;
  return precision_bytes(z.precision);
}

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

MemoryPlan plan_memory(const PlanInputs& in) {
  const zero::ZeroConfig& z = in.zero;
  MemoryPlan plan;
  const uint64_t elem = precision_bytes(z.precision);
  const bool stage0 = z.stage == 0;
  const auto world = static_cast<uint64_t>(std::max(in.world_size, 1));
  const uint64_t wl = stage0 ? 1 : world;        // the layout's world size
  const size_t kinds = 2 + in.optimizer_states;  // params, grads, states

  uint64_t largest_padded = 0, total_padded = 0, largest_numel = 0, largest_trainable = 0;
  uint64_t managed_persistent = 0, managed_other = 0, persistent_budget = 0;
  uint64_t largest_other = 0, count_other = 0;          // managed non-persistent parameters
  offload::CpuTierBudget cpu_tier(z.param_max_in_cpu);  // ParamSwapper's, in add() order
  for (const PlanParam& p : in.params) {
    largest_numel = std::max(largest_numel, p.numel);
    if (!p.trainable) {
      plan.device_resident += p.numel * elem;
      continue;
    }
    largest_trainable = std::max(largest_trainable, p.numel);
    if (p.tied_outside) {
      plan.pinned += round_page(p.numel * elem);  // TiedGradRouter's parked sum
    }
    plan.model_numel += p.numel;
    const uint64_t slice = (p.numel + wl - 1) / wl;
    plan.partition_numel += slice;
    const uint64_t padded = stage0 ? p.numel : slice * world;
    largest_padded = std::max(largest_padded, padded);
    total_padded += padded;
    const bool managed = z.stage == 3 && p.in_block && !p.outside_use;
    if (!managed) {
      plan.device_resident += slice * wl * elem;
      continue;
    }
    const bool persistent = p.numel <= z.param_persistence_threshold &&
                            persistent_budget + p.numel <= z.model_persistence_threshold;
    if (persistent) {
      persistent_budget += p.numel;
      managed_persistent += p.numel;
    } else {
      managed_other += p.numel;
      largest_other = std::max(largest_other, p.numel);
      ++count_other;
    }
    switch (z.offload_param) {
      case OffloadTarget::kNone:
        plan.device_slices += slice * elem;
        break;
      case OffloadTarget::kCpu:
        plan.pinned += round_page(slice * elem);
        break;
      case OffloadTarget::kNvme:
        if (cpu_tier.place(slice)) {
          plan.pinned += round_page(slice * elem);
        } else {
          for (uint64_t done = 0; done < slice; done += z.param_buffer_size) {
            plan.nvme += round_page(std::min(z.param_buffer_size, slice - done) * elem);
          }
        }
        break;
    }
  }

  // Stage 3 gathered parameters: at most the live limit of non-persistent ones, plus the
  // persistent ones. With offloaded params also the device copies the coordinator starts
  // ahead of use (zero/param_coordinator.cc): every non-persistent parameter that begins
  // less than 2 x stage3_prefetch_bucket_size elements ahead, so up to that window plus one
  // parameter, not yet counted as live. The param pool does not bound them: it limits reads
  // ahead only, a copy forces its read (zero/param_store.cc start_copy) and its device
  // buffer stays until the parameter is released. The window opens from the second pass
  // on (the first records the trace and fetches on demand), so a run of one micro-batch
  // measures far less than this. One rank: a copy is the full parameter. Several
  // ranks: a copy is a slice (ceil(numel / world) elements, hence + one element per
  // parameter), and a slice stays until its all-gather completes, so besides the window's
  // slices the live parameters' slices can all be there at once (a block's all-gathers are
  // started together, zero/param_store.cc). Without offload the slices are resident
  // (device_slices) and only the full parameters come and go.
  if (managed_persistent + managed_other > 0) {
    const uint64_t live = std::min(z.max_live_parameters, managed_other) + managed_persistent;
    const bool offloaded = z.offload_param != OffloadTarget::kNone;
    const uint64_t window =
        offloaded && z.prefetch_bucket_size > 0
            ? std::min(managed_other, 2 * z.prefetch_bucket_size - 1 + largest_other)
            : 0;
    if (world == 1) {
      // Never more than every managed parameter at once.
      const uint64_t all = managed_other + managed_persistent;
      plan.device_gathered = offloaded ? std::min(live + window, all) * elem : 0;
    } else {
      const uint64_t in_flight = offloaded ? live + window : 0;
      plan.device_gathered =
          (live + (in_flight + world - 1) / world + std::min(count_other, in_flight)) * elem;
    }
    if (z.offload_param == OffloadTarget::kNvme) {
      plan.pinned += z.param_buffer_count * round_page(z.param_buffer_size * elem);
    }
  }

  // Gradient buckets (zero/grad_reducer.h).
  if (world > 1) {
    const uint64_t ce = comm_bytes(z);
    const uint64_t cap = std::max(
        largest_padded, std::min(std::max<uint64_t>(z.reduce_bucket_size, 1), total_padded));
    const uint64_t slots = z.overlap_comm ? 2 : 1;
    plan.device_buckets = cap * ce + slots * cap * ce;
    if (!stage0 && z.reduce_scatter) {
      plan.device_buckets += slots * (cap / world) * ce;
    }
    if (!in.host_reads_device_memory) {  // the bucket at stage 0, this rank's region otherwise
      plan.pinned += round_page((stage0 ? cap : cap / world) * ce);
    }
  } else if (!in.host_reads_device_memory) {
    plan.pinned += round_page(largest_trainable * sizeof(float));  // a whole gradient
  }

  // The optimizer's partition (zero/partitioned_optimizer.h, offload/optimizer_swapper.h).
  const offload::SubGroupCut cut = offload::cut_sub_groups(plan.partition_numel, z.sub_group_size);
  const uint64_t group = cut.largest();
  const uint64_t arrays = plan.partition_numel * 4 * kinds;
  switch (z.offload_optimizer) {
    case OffloadTarget::kNone:
      plan.device_optimizer = arrays;
      plan.pinned += round_page(group * 2);  // the param copy pool
      break;
    case OffloadTarget::kCpu:
      plan.host += arrays;
      plan.pinned += round_page(group * 2);
      break;
    case OffloadTarget::kNvme: {
      const uint64_t sets = 1 + (z.pipeline_read ? 1 : 0) + (z.pipeline_write ? 1 : 0);
      plan.pinned += sets * kinds * round_page(group * 4) + sets * round_page(group * 2) +
                     2 * round_page(group * 4);
      if (cut.count > 0) {  // an extent per kind and sub-group
        plan.nvme +=
            kinds * ((cut.count - 1) * round_page(cut.size * 4) + round_page(cut.last * 4));
      }
      break;
    }
  }
  // Activations (zero/activation_offload.h): on the device, or all saved inputs but the one
  // being recomputed in pinned buffers (cpu) or in the swap file through two pinned staging
  // buffers (nvme).
  const ActivationEstimate& a = in.activations;
  const uint64_t saved_page = round_page(a.saved_input_bytes);
  switch (a.saved_inputs == 0 ? OffloadTarget::kNone : z.activation_offload) {
    case OffloadTarget::kNone:
      plan.device_activations = a.total();
      break;
    case OffloadTarget::kCpu:
      plan.device_activations = a.working_bytes + a.saved_input_bytes;
      plan.pinned_activations = a.saved_inputs * saved_page;
      break;
    case OffloadTarget::kNvme:
      plan.device_activations = a.working_bytes + a.saved_input_bytes;
      plan.pinned_activations = std::min<uint64_t>(2, a.saved_inputs) * saved_page;
      plan.nvme_activations = a.saved_inputs * saved_page;
      break;
  }
  plan.pinned += plan.pinned_activations;
  plan.nvme += plan.nvme_activations;
  plan.host_peak_init = largest_numel * 4 * 2;
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
