// Which SIMD unit the optimizer kernels run on, chosen at run time.
//
// The kernels are compiled once per instruction set (AVX-512, AVX2+FMA+F16C, SSE2 on x86-64;
// NEON on ARM; plain scalar everywhere) and the widest one the CPU and OS support is used, so
// one binary runs on any x86-64. The environment variable ZINF_SIMD (avx512, avx2, sse2,
// neon, scalar), read at first use, or force_simd_level() (tests, benchmarks) picks another
// one; a level the machine cannot run is refused (a warning for ZINF_SIMD, an exception for
// force_simd_level).
//
// Thread-safety: all functions are thread-safe; a level change affects steps that start
// after it.
#pragma once

#include <string_view>
#include <vector>

namespace zinf::optimizer_cpu {

enum class SimdLevel {
  kScalar,
  kSse2,
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512F (+ the AVX2/FMA/F16C it implies)
  kNeon,
};

// "scalar", "sse2", "avx2", "avx512" or "neon".
[[nodiscard]] std::string_view to_string(SimdLevel level) noexcept;

// Parses the names above (case-sensitive); throws std::invalid_argument("ZINF_SIMD ...") on
// an unknown name.
[[nodiscard]] SimdLevel parse_simd_level(std::string_view name);

// Levels compiled into this binary and supported by this CPU, narrowest first.
[[nodiscard]] std::vector<SimdLevel> available_simd_levels();

// The level steps use now: the forced one, else ZINF_SIMD, else the widest available.
[[nodiscard]] SimdLevel active_simd();
// Its name, e.g. "avx512" (for `zinf --version` and logs).
[[nodiscard]] std::string_view active_simd_level();

// Makes every following step use `level`; throws std::invalid_argument("level ...") if it
// is not in available_simd_levels().
void force_simd_level(SimdLevel level);
// Undoes force_simd_level(): back to ZINF_SIMD or the widest available.
void reset_simd_level();

}  // namespace zinf::optimizer_cpu
