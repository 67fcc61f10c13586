// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; run only when the CPU and OS
// support all three, see simd_level.cc).
#include "optimizer_cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include "optimizer_cpu/kernels_impl.h"
#include "optimizer_cpu/xsimd_ops.h"

namespace zinf::optimizer_cpu::detail {
namespace {

struct Avx2Ops : XsimdOps<xsimd::fma3<xsimd::avx2>> {
  static constexpr bool kCanStream = true;

  // Round to nearest even, NaN kept quiet (see kernels_avx512.cc).
  static __m128i pack_bf16(V v) {
    const __m256 f = v;
    const __m256i bits = _mm256_castps_si256(f);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // Every lane is in [0, 0xffff], so the unsigned saturating pack is exact.
    return _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
  }
  static __m128i pack_fp16(V v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }

  static V load_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load_fp16(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_bf16(std::uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack_bf16(v));
  }
  static void store_fp16(std::uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack_fp16(v));
  }
  // p must be 16-byte aligned.
  static void stream_bf16(std::uint16_t* p, V v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), pack_bf16(v));
  }
  static void stream_fp16(std::uint16_t* p, V v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), pack_fp16(v));
  }
  static void fence() { _mm_sfence(); }
};

}  // namespace

const KernelTable* kernels_avx2() { return &Kernels<Avx2Ops>::kTable; }

}  // namespace zinf::optimizer_cpu::detail

#else

namespace zinf::optimizer_cpu::detail {
const KernelTable* kernels_avx2() { return nullptr; }
}  // namespace zinf::optimizer_cpu::detail

#endif
