// Plain C++ kernels, one element at a time: the fallback for any CPU and the baseline the
// SIMD levels are tested against.
#include <cfloat>
#include <cmath>

#include "optimizer_cpu/half.h"
#include "optimizer_cpu/kernels.h"
#include "optimizer_cpu/kernels_impl.h"

namespace zinf::optimizer_cpu::detail {
namespace {

struct ScalarOps {
  using V = float;
  static constexpr std::size_t kWidth = 1;
  static constexpr bool kCanStream = false;

  static V broadcast(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V sqrt(V a) { return std::sqrt(a); }
  static V sign(V a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  static std::uint32_t count_nonfinite(V g) { return std::fabs(g) <= FLT_MAX ? 0 : 1; }
  static V load_bf16(const std::uint16_t* p) { return bf16_to_float(*p); }
  static void store_bf16(std::uint16_t* p, V v) { *p = float_to_bf16(v); }
  static V load_fp16(const std::uint16_t* p) { return fp16_to_float(*p); }
  static void store_fp16(std::uint16_t* p, V v) { *p = float_to_fp16(v); }
};

}  // namespace

const KernelTable* kernels_scalar() { return &Kernels<ScalarOps>::kTable; }

}  // namespace zinf::optimizer_cpu::detail
