#include "optimizer_cpu/simd_level.h"

#include <spdlog/spdlog.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "optimizer_cpu/kernels.h"

namespace zinf::optimizer_cpu {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C from CPUID leaf 1 (not every compiler's __builtin_cpu_supports knows "f16c"); its
// register state is AVX's, whose OS support the avx2/avx512f checks below include.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}
#endif

// What the CPU and OS can run, ignoring what was compiled in.
bool cpu_supports(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // libgcc's checks include the OS enabling the register state (XGETBV) for AVX/AVX-512.
    case SimdLevel::kSse2:
      return __builtin_cpu_supports("sse2");
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
    case SimdLevel::kSse2:
    case SimdLevel::kAvx2:
    case SimdLevel::kAvx512:
      return false;
#endif
    case SimdLevel::kNeon:
#if defined(__aarch64__) || defined(__ARM_NEON)
      return true;
#else
      return false;
#endif
  }
  return false;
}

const detail::KernelTable* compiled_table(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return detail::kernels_scalar();
    case SimdLevel::kSse2:
      return detail::kernels_sse2();
    case SimdLevel::kAvx2:
      return detail::kernels_avx2();
    case SimdLevel::kAvx512:
      return detail::kernels_avx512();
    case SimdLevel::kNeon:
      return detail::kernels_neon();
  }
  return nullptr;
}

bool is_available(SimdLevel level) {
  return compiled_table(level) != nullptr && cpu_supports(level);
}

// The level without a forced override: ZINF_SIMD if set and usable, else the widest.
SimdLevel default_level() {
  const std::vector<SimdLevel> levels = available_simd_levels();
  const SimdLevel widest = levels.back();
  const char* env = std::getenv("ZINF_SIMD");
  if (env == nullptr || *env == '\0') return widest;
  try {
    const SimdLevel requested = parse_simd_level(env);
    if (is_available(requested)) return requested;
    spdlog::warn("ZINF_SIMD={} is not supported on this machine; using {}", env, to_string(widest));
  } catch (const std::invalid_argument&) {
    spdlog::warn("ZINF_SIMD={} is not a SIMD level (scalar, sse2, avx2, avx512, neon); using {}",
                 env, to_string(widest));
  }
  return widest;
}

SimdLevel cached_default_level() {
  static const SimdLevel level = default_level();
  return level;
}

constexpr int kNotForced = -1;
std::atomic<int> forced_level{kNotForced};

}  // namespace

std::string_view to_string(SimdLevel level) noexcept {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kSse2:
      return "sse2";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kNeon:
      return "neon";
  }
  return "unknown";
}

SimdLevel parse_simd_level(std::string_view name) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                          SimdLevel::kAvx512, SimdLevel::kNeon}) {
    if (name == to_string(level)) return level;
  }
  throw std::invalid_argument("ZINF_SIMD: unknown SIMD level '" + std::string(name) +
                              "' (expected scalar, sse2, avx2, avx512 or neon)");
}

std::vector<SimdLevel> available_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kNeon, SimdLevel::kAvx2,
                          SimdLevel::kAvx512}) {
    if (is_available(level)) levels.push_back(level);
  }
  return levels;
}

SimdLevel active_simd() {
  const int forced = forced_level.load(std::memory_order_acquire);
  if (forced != kNotForced) return static_cast<SimdLevel>(forced);
  return cached_default_level();
}

std::string_view active_simd_level() { return to_string(active_simd()); }

void force_simd_level(SimdLevel level) {
  if (!is_available(level)) {
    throw std::invalid_argument("level: SIMD level '" + std::string(to_string(level)) +
                                "' is not available on this machine");
  }
  forced_level.store(static_cast<int>(level), std::memory_order_release);
}

void reset_simd_level() { forced_level.store(kNotForced, std::memory_order_release); }

namespace detail {

const KernelTable& kernel_table(SimdLevel level) {
  const KernelTable* table = compiled_table(level);
  if (table == nullptr) {
    throw std::invalid_argument("level: SIMD level '" + std::string(to_string(level)) +
                                "' is not compiled into this binary");
  }
  return *table;
}

const KernelTable& active_kernel_table() { return kernel_table(active_simd()); }

}  // namespace detail
}  // namespace zinf::optimizer_cpu
