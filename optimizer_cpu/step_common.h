// Argument checks and the tiled TBB driver shared by the optimizers' step(). Internal.
//
// Thread-safety: stateless.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "optimizer_cpu/kernels.h"
#include "optimizer_cpu/optimizer.h"

namespace zinf::optimizer_cpu::detail {

// Elements per work item: a multiple of every vector width, large enough that TBB's
// per-task cost vanishes (an Adam tile moves 1.75 MiB) and small enough to balance 2..N
// threads on a sub-group of a few million elements.
inline constexpr std::size_t kTileElements = std::size_t{1} << 16;

// From this many elements on, the 16-bit copy is written with non-temporal stores: it
// would not stay in cache anyway, and skipping the read-for-ownership of its lines saves
// 2 of 32 bytes of memory traffic per element. Smaller copies stay cached for the caller.
inline constexpr std::size_t kStreamCopyMinElements = std::size_t{1} << 20;

// Throws std::invalid_argument naming `name` unless lo <= value <= hi (NaN fails).
void check_range(std::string_view name, float value, float lo, float hi);
// Same with an open upper bound: lo <= value < hi.
void check_range_open(std::string_view name, float value, float lo, float hi);

// Checks what every optimizer needs (params, grads, dtypes, grad_scale, copy, step) plus the
// states it uses, and packs the arrays for the kernels.
[[nodiscard]] KernelArrays check_step_args(const StepArgs& args, StateArrays states);

// Calls kernel(begin, end) over [0, numel) in tiles of kTileElements spread over the current
// TBB arena (in the calling thread alone when numel is small) and returns the sum of what
// the calls return.
using RangeKernel = std::uint64_t (*)(const void* context, std::size_t begin, std::size_t end);
[[nodiscard]] std::uint64_t parallel_over_tiles(std::size_t numel, RangeKernel kernel,
                                                const void* context);

// NaN/Inf among data[i] * scale, over tiles like parallel_over_tiles.
[[nodiscard]] std::uint64_t count_scaled_nonfinite(const void* data, DType dtype, float scale,
                                                   std::size_t numel);

// The common step: optional pre-scan for skip_if_nonfinite, then the update over tiles.
template <class Coefficients>
[[nodiscard]] StepResult run_step(const StepArgs& args, const KernelArrays& arrays,
                                  const Coefficients& coefficients,
                                  std::uint64_t (*kernel)(const Coefficients&, const KernelArrays&,
                                                          std::size_t, std::size_t)) {
  StepResult result;
  if (args.skip_if_nonfinite) {
    result.nonfinite_grads =
        count_scaled_nonfinite(args.grads, args.grad_dtype, args.grad_scale, args.numel);
    if (result.nonfinite_grads != 0) {
      result.skipped = true;
      return result;
    }
  }
  struct Context {
    const Coefficients* coefficients;
    const KernelArrays* arrays;
    std::uint64_t (*kernel)(const Coefficients&, const KernelArrays&, std::size_t, std::size_t);
  };
  const Context context{&coefficients, &arrays, kernel};
  result.nonfinite_grads = parallel_over_tiles(
      args.numel,
      [](const void* c, std::size_t begin, std::size_t end) {
        const auto* ctx = static_cast<const Context*>(c);
        return ctx->kernel(*ctx->coefficients, *ctx->arrays, begin, end);
      },
      &context);
  return result;
}

}  // namespace zinf::optimizer_cpu::detail
