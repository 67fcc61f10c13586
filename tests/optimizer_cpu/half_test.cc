// The scalar fp32 <-> bf16/fp16 conversions (half.h): exhaustive round trips, round to
// nearest even against an exact reference, and agreement with the F16C instructions.
#include "optimizer_cpu/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "tests/optimizer_cpu/test_util.h"

namespace zinf::optimizer_cpu::testing {
namespace {

TEST(HalfTest, Fp16RoundTripsEveryValue) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_to_float(h);
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    ASSERT_EQ(std::isnan(f), nan) << std::hex << bits;
    // NaNs come back quiet; everything else unchanged.
    ASSERT_EQ(float_to_fp16(f), nan ? (h | 0x200) : h) << std::hex << bits;
  }
}

TEST(HalfTest, Fp16KnownValues) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // tie at the top rounds to even: Inf
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);  // tie to even: 0
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x3p-25f), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x7c00), HUGE_VALF);
}

TEST(HalfTest, Bf16IsRoundToNearestEven) {
  std::mt19937 rng(test_seed());
  for (int k = 0; k < 1 << 20; ++k) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float x = std::bit_cast<float>(bits);
    const std::uint16_t got = float_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(got))) << std::hex << bits;
      ASSERT_EQ(got & 0x8000, (bits >> 16) & 0x8000);
      ASSERT_NE(got & 0x40, 0);  // quiet
      continue;
    }
    // Exact reference in double: truncated magnitude a, next bf16 magnitude a + ulp.
    const std::uint32_t lo = (bits & 0x7fffffffu) >> 16;
    const double a = std::fabs(static_cast<double>(bf16_to_float(static_cast<std::uint16_t>(lo))));
    const int exponent = static_cast<int>((lo >> 7) & 0xff);
    const double ulp = std::ldexp(1.0, (exponent == 0 ? 1 : exponent) - 127 - 7);
    const double ax = std::fabs(static_cast<double>(x));
    std::uint32_t want = lo;
    if (ax - a > a + ulp - ax || (ax - a == a + ulp - ax && (lo & 1))) want = lo + 1;
    want |= (bits >> 16) & 0x8000;
    ASSERT_EQ(got, want) << std::hex << bits;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd goes up
  EXPECT_EQ(float_to_bf16(HUGE_VALF), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // overflow to Inf
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("f16c"))) std::uint16_t f16c_from_float(float x) {
  const __m128i h = _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
}
__attribute__((target("f16c"))) float f16c_to_float(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

TEST(HalfTest, Fp16MatchesF16c) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(fp16_to_float(h)),
              std::bit_cast<std::uint32_t>(f16c_to_float(h)))
        << std::hex << bits;
  }
  std::mt19937 rng(test_seed());
  for (int k = 0; k < 1 << 20; ++k) {
    // Bias towards the fp16 range so that normals, subnormals and ties all occur.
    std::uint32_t bits = rng();
    if (k % 2 == 0) bits = (bits & 0x80ffffffu) | ((0x30u + (bits >> 24) % 0x20u) << 24);
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(float_to_fp16(x), f16c_from_float(x)) << std::hex << bits;
  }
}
#endif

}  // namespace
}  // namespace zinf::optimizer_cpu::testing
