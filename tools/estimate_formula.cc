// DeepSpeed's ZeRO-3 model-state estimate (a formula, checked by tests/tools against values
// worked by hand), kept apart from the LibTorch-heavy estimate command.
#include <algorithm>
#include <cmath>

#include "tools/estimate.h"

namespace zinf::tools {

std::vector<DeepSpeedEstimate> deepspeed_zero3_estimates(uint64_t total_params,
                                                         uint64_t largest_layer_params,
                                                         int gpus_per_node, int nodes) {
  constexpr double kBuffer = 1.5;  // additional_buffer_factor
  const double total = static_cast<double>(total_params);
  const double gpus = static_cast<double>(gpus_per_node) * nodes;
  const double gpus_factor = 1.0 / nodes;
  const double largest = 4.0 * static_cast<double>(largest_layer_params);
  const double per_node = gpus_per_node;
  auto bytes = [](double v) { return static_cast<uint64_t>(std::llround(v)); };
  std::vector<DeepSpeedEstimate> rows;
  for (int init : {1, 0}) {
    const bool zero_init = init == 1;
    // Params and optimizer on CPU: the device holds the largest layer only.
    rows.push_back(
        {"cpu", "cpu", zero_init, bytes(largest),
         bytes(total * (zero_init ? 18 * gpus_factor : std::max(4 * per_node, 18 * gpus_factor)) *
               kBuffer)});
    // Optimizer on CPU: plus the fp16 param slices.
    rows.push_back(
        {"none", "cpu", zero_init, bytes(largest + std::floor(2 * total / gpus)),
         bytes(total * (zero_init ? 16 * gpus_factor : std::max(4 * per_node, 16 * gpus_factor)) *
               kBuffer)});
    // Nothing offloaded: 18 bytes per param partitioned over the accelerators.
    rows.push_back({"none", "none", zero_init, bytes(largest + std::floor(18 * total / gpus)),
                    bytes((zero_init ? static_cast<double>(largest_layer_params) : total) * 4 *
                          per_node * kBuffer)});
  }
  return rows;
}

}  // namespace zinf::tools
