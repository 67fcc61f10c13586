// SIMD "ops" types for kernels_impl.h built on xsimd batches. Internal; included only by the
// kernels_<level>.cc translation units, each compiled with its instruction set's flags.
//
// XsimdOps<Arch> does the arithmetic with xsimd and converts 16-bit elements lane by lane
// through half.h (portable, used on NEON); the x86 levels derive from it and replace the
// conversions with intrinsics (see kernels_<level>.cc).
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "optimizer_cpu/half.h"

namespace zinf::optimizer_cpu::detail {
namespace {

template <class Arch>
struct XsimdOps {
  using V = xsimd::batch<float, Arch>;
  static constexpr std::size_t kWidth = V::size;
  // Whether stream_bf16/stream_fp16 (non-temporal, aligned) and fence() exist.
  static constexpr bool kCanStream = false;

  static V broadcast(float x) { return V(x); }
  static V load(const float* p) { return V::load_unaligned(p); }
  static void store(float* p, V v) { v.store_unaligned(p); }
  static V fma(V a, V b, V c) { return xsimd::fma(a, b, c); }
  static V sqrt(V a) { return xsimd::sqrt(a); }

  // +1, -1 or 0 (also for NaN).
  static V sign(V a) {
    const V zero(0.0f);
    return xsimd::select(a > zero, V(1.0f), xsimd::select(a < zero, V(-1.0f), zero));
  }

  // Lanes that are NaN or +-Inf.
  static std::uint32_t count_nonfinite(V g) {
    const auto finite = xsimd::abs(g) <= V(FLT_MAX);
    if (xsimd::all(finite)) return 0;
    return static_cast<std::uint32_t>(xsimd::hadd(xsimd::select(finite, V(0.0f), V(1.0f))));
  }

  static V load_bf16(const std::uint16_t* p) {
    alignas(64) float lanes[kWidth];
    for (std::size_t j = 0; j < kWidth; ++j) lanes[j] = bf16_to_float(p[j]);
    return V::load_aligned(lanes);
  }
  static void store_bf16(std::uint16_t* p, V v) {
    alignas(64) float lanes[kWidth];
    v.store_aligned(lanes);
    for (std::size_t j = 0; j < kWidth; ++j) p[j] = float_to_bf16(lanes[j]);
  }
  static V load_fp16(const std::uint16_t* p) {
    alignas(64) float lanes[kWidth];
    for (std::size_t j = 0; j < kWidth; ++j) lanes[j] = fp16_to_float(p[j]);
    return V::load_aligned(lanes);
  }
  static void store_fp16(std::uint16_t* p, V v) {
    alignas(64) float lanes[kWidth];
    v.store_aligned(lanes);
    for (std::size_t j = 0; j < kWidth; ++j) p[j] = float_to_fp16(lanes[j]);
  }
};

}  // namespace
}  // namespace zinf::optimizer_cpu::detail
