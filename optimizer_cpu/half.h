// Scalar conversions between fp32 and the 16-bit float formats (bfloat16, IEEE binary16),
// bit-exact with what the SIMD kernels produce: round-to-nearest-even, NaN stays NaN (made
// quiet), overflow goes to +-Inf, subnormals are kept. Used by the scalar kernels, the tests
// and callers that fill or read 16-bit buffers.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstdint>

namespace zinf::optimizer_cpu {

// bfloat16 bits -> fp32 (exact).
[[nodiscard]] inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// fp32 -> bfloat16 bits, round to nearest even; NaN -> quiet NaN with the same sign.
[[nodiscard]] inline std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16 bits -> fp32 (exact).
[[nodiscard]] float fp16_to_float(std::uint16_t bits) noexcept;

// fp32 -> IEEE binary16 bits, round to nearest even, overflow to Inf, NaN -> quiet NaN.
[[nodiscard]] std::uint16_t float_to_fp16(float value) noexcept;

}  // namespace zinf::optimizer_cpu
