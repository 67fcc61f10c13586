// AVX-512F kernels (compiled with -mavx512f -mavx2 -mfma -mf16c; run only when the CPU and OS
// support AVX-512F, see simd_level.cc).
#include "optimizer_cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__F16C__)

#include <immintrin.h>

#include "optimizer_cpu/kernels_impl.h"
#include "optimizer_cpu/xsimd_ops.h"

namespace zinf::optimizer_cpu::detail {
namespace {

struct Avx512Ops : XsimdOps<xsimd::avx512f> {
  // (xsimd 8.1's generic hadd needs AVX-512DQ; a mask popcount needs only F.)
  static std::uint32_t count_nonfinite(V g) {
    const __mmask16 finite = _mm512_cmp_ps_mask(xsimd::abs(g), _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
    return static_cast<std::uint32_t>(16 - __builtin_popcount(finite));
  }

  static constexpr bool kCanStream = true;

  // Round to nearest even: add 0x7fff + lsb of the kept half, keep the top 16 bits. NaNs
  // keep their sign and top payload bits and are made quiet.
  static __m256i pack_bf16(V v) {
    const __m512 f = v;
    const __m512i bits = _mm512_castps_si512(f);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i bias =
        _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
  }
  static __m256i pack_fp16(V v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }

  static V load_bf16(const std::uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load_fp16(const std::uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_bf16(std::uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_bf16(v));
  }
  static void store_fp16(std::uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_fp16(v));
  }
  // p must be 32-byte aligned.
  static void stream_bf16(std::uint16_t* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_bf16(v));
  }
  static void stream_fp16(std::uint16_t* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_fp16(v));
  }
  static void fence() { _mm_sfence(); }
};

}  // namespace

const KernelTable* kernels_avx512() { return &Kernels<Avx512Ops>::kTable; }

}  // namespace zinf::optimizer_cpu::detail

#else

namespace zinf::optimizer_cpu::detail {
const KernelTable* kernels_avx512() { return nullptr; }
}  // namespace zinf::optimizer_cpu::detail

#endif
