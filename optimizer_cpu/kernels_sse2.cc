// SSE2 kernels (the x86-64 baseline; no FMA, so fma() is a multiply and an add, and fp16
// is converted lane by lane in software).
#include "optimizer_cpu/kernels.h"

#if defined(__x86_64__) && defined(__SSE2__)

#include <emmintrin.h>

#include "optimizer_cpu/kernels_impl.h"
#include "optimizer_cpu/xsimd_ops.h"

namespace zinf::optimizer_cpu::detail {
namespace {

struct Sse2Ops : XsimdOps<xsimd::sse2> {
  static V load_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    // Interleaving zeros below each element puts it in the upper half of a 32-bit lane.
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
  }

  // Round to nearest even, NaN kept quiet (see kernels_avx512.cc).
  static void store_bf16(std::uint16_t* p, V v) {
    const __m128 f = v;
    const __m128i bits = _mm_castps_si128(f);
    const __m128i high = _mm_srli_epi32(bits, 16);
    const __m128i bias =
        _mm_add_epi32(_mm_and_si128(high, _mm_set1_epi32(1)), _mm_set1_epi32(0x7fff));
    const __m128i rounded = _mm_srli_epi32(_mm_add_epi32(bits, bias), 16);
    const __m128i quiet_nan = _mm_or_si128(high, _mm_set1_epi32(0x40));
    const __m128i is_nan = _mm_castps_si128(_mm_cmpunord_ps(f, f));
    __m128i result =
        _mm_or_si128(_mm_and_si128(is_nan, quiet_nan), _mm_andnot_si128(is_nan, rounded));
    // SSE2 has only a signed saturating pack: sign-extend the low 16 bits first so that it
    // keeps them unchanged.
    result = _mm_srai_epi32(_mm_slli_epi32(result, 16), 16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(result, result));
  }
};

}  // namespace

const KernelTable* kernels_sse2() { return &Kernels<Sse2Ops>::kTable; }

}  // namespace zinf::optimizer_cpu::detail

#else

namespace zinf::optimizer_cpu::detail {
const KernelTable* kernels_sse2() { return nullptr; }
}  // namespace zinf::optimizer_cpu::detail

#endif
