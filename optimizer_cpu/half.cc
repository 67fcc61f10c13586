#include "optimizer_cpu/half.h"

#include <bit>
#include <cstdint>

namespace zinf::optimizer_cpu {

float fp16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    // Inf, or NaN made quiet with its payload kept (what F16C's vcvtph2ps does).
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_fp16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: quiet, top payload bits kept (as vcvtps2ph does).
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x47800000u) {
    // >= 65536 (and Inf): beyond the largest finite half after any rounding.
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias the exponent and round the 13 dropped bits to nearest
    // even; a carry out of the mantissa correctly bumps the exponent (up to Inf).
    const std::uint32_t odd = (magnitude >> 13) & 1u;
    magnitude += 0xc8000fffu + odd;  // ((15 - 127) << 23) + 0xfff, modulo 2^32
    return static_cast<std::uint16_t>(sign | (magnitude >> 13));
  }
  // Subnormal half or zero: adding 0.5 aligns the value's bits with the half's subnormal
  // mantissa, and the FPU's addition rounds them to nearest even.
  constexpr std::uint32_t kHalf = 0x3f000000u;  // 0.5f
  const float aligned = std::bit_cast<float>(magnitude) + std::bit_cast<float>(kHalf);
  return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(aligned) - kHalf));
}

}  // namespace zinf::optimizer_cpu
