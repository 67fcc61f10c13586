#include "optimizer_cpu/step_common.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>
#include <tbb/partitioner.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace zinf::optimizer_cpu::detail {
namespace {

[[noreturn]] void throw_invalid(std::string_view name, const std::string& what) {
  throw std::invalid_argument(std::string(name) + ": " + what);
}

}  // namespace

void check_range(std::string_view name, float value, float lo, float hi) {
  if (!(value >= lo && value <= hi)) {
    throw_invalid(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(value));
  }
}

void check_range_open(std::string_view name, float value, float lo, float hi) {
  if (!(value >= lo && value < hi)) {
    throw_invalid(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "), got " + std::to_string(value));
  }
}

KernelArrays check_step_args(const StepArgs& args, StateArrays states) {
  const bool uses_exp_avg = states.exp_avg;
  const bool uses_exp_avg_sq = states.exp_avg_sq;
  auto check_dtype = [](std::string_view name, DType dtype) {
    if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
      throw_invalid(name, "unknown dtype");
    }
  };
  check_dtype("grad_dtype", args.grad_dtype);
  if (args.state_dtype != DType::kFloat32 && args.state_dtype != DType::kBFloat16) {
    throw_invalid("state_dtype", "must be fp32 or bf16");
  }
  if (args.step < 1) throw_invalid("step", "must be >= 1, got " + std::to_string(args.step));
  if (!(std::isfinite(args.grad_scale) && args.grad_scale > 0.0f)) {
    throw_invalid("grad_scale", "must be finite and > 0, got " + std::to_string(args.grad_scale));
  }
  CopyOut copy_out = CopyOut::kNone;
  if (args.param_copy != nullptr) {
    if (args.param_copy_dtype == DType::kBFloat16) {
      copy_out = CopyOut::kBFloat16;
    } else if (args.param_copy_dtype == DType::kFloat16) {
      copy_out = CopyOut::kFloat16;
    } else {
      throw_invalid("param_copy_dtype", "must be bf16 or fp16");
    }
  }
  if (args.numel > 0) {
    if (args.params == nullptr) throw_invalid("params", "is null");
    if (args.grads == nullptr) throw_invalid("grads", "is null");
    if (uses_exp_avg && args.exp_avg == nullptr) throw_invalid("exp_avg", "is null");
    if (uses_exp_avg_sq && args.exp_avg_sq == nullptr) throw_invalid("exp_avg_sq", "is null");
  }
  return KernelArrays{args.params,
                      args.grads,
                      uses_exp_avg ? args.exp_avg : nullptr,
                      uses_exp_avg_sq ? args.exp_avg_sq : nullptr,
                      args.param_copy,
                      args.grad_dtype,
                      args.state_dtype,
                      copy_out,
                      args.numel >= kStreamCopyMinElements,
                      args.grad_scale};
}

std::uint64_t parallel_over_tiles(std::size_t numel, RangeKernel kernel, const void* context) {
  const std::size_t tiles = (numel + kTileElements - 1) / kTileElements;
  if (tiles <= 1) return kernel(context, 0, numel);
  // The static partitioner hands each thread one contiguous run of tiles: long sequential
  // streams for the hardware prefetchers, and no task stealing on a memory-bound loop.
  return tbb::parallel_reduce(
      tbb::blocked_range<std::size_t>(0, tiles), std::uint64_t{0},
      [&](const tbb::blocked_range<std::size_t>& r, std::uint64_t sum) {
        const std::size_t begin = r.begin() * kTileElements;
        const std::size_t end = std::min(numel, r.end() * kTileElements);
        return sum + kernel(context, begin, end);
      },
      [](std::uint64_t a, std::uint64_t b) { return a + b; }, tbb::static_partitioner());
}

std::uint64_t count_scaled_nonfinite(const void* data, DType dtype, float scale,
                                     std::size_t numel) {
  struct Context {
    const KernelTable* table;
    const void* data;
    DType dtype;
    float scale;
  };
  const Context context{&active_kernel_table(), data, dtype, scale};
  return parallel_over_tiles(
      numel,
      [](const void* c, std::size_t begin, std::size_t end) {
        const auto* ctx = static_cast<const Context*>(c);
        return ctx->table->count_nonfinite(ctx->data, ctx->dtype, ctx->scale, begin, end);
      },
      &context);
}

}  // namespace zinf::optimizer_cpu::detail

namespace zinf::optimizer_cpu {

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) noexcept { return dtype == DType::kFloat32 ? 4 : 2; }

std::uint64_t count_nonfinite(const void* data, DType dtype, std::size_t numel) {
  if (numel > 0 && data == nullptr) throw std::invalid_argument("data: is null");
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
    throw std::invalid_argument("dtype: unknown dtype");
  }
  return detail::count_scaled_nonfinite(data, dtype, 1.0f, numel);
}

}  // namespace zinf::optimizer_cpu
