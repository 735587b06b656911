// AVX-512 kernels (x86-64), compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
// for this file only. The algorithms are those of kernels/simd_impl.h, which the AVX2 and NEON
// tables run too; only the 16-lane traits below are specific (loads, masked tails via __mmask16, a
// fixed-order 16 -> 8 -> 4 -> 1 horizontal sum and its four-at-once form, a bf16 widen-and-shift
// and an int8 decoder mirroring AVX2's, an MXFP4 decoder of its own, four groups per block, FP8
// E4M3 through the f16 converter and INT4 by a shift and a vpermps lookup).
// With 32 zmm registers the plain tile is 6x4 (24 accumulators) and the MXFP4 tile 4x2 with its
// even and odd half sums and its accumulators all in registers (24 vectors). The sizes were tuned
// on a Zen 5 core (docs/PERFORMANCE.md, "On a Zen 5 core with AVX-512");
// `tests/deltafin_tests --gtest_filter='Kernels*'` checks this table wherever the CPU has AVX-512.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's avx512fintrin.h builds _mm512_undefined_*() from a self-initialised variable, which
// -Wuninitialized reports wherever such an intrinsic is inlined (GCC bug 105593). This file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>
#include <sleef.h>

#include "kernels/kernels.h"
#include "kernels/simd_impl.h"

namespace deltafin::kernels {
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr int L = 16;
  static constexpr int kMR = 6, kNR = 4;
  // MXFP4: 4x2 with everything in registers beat 6x4 with half sums through L1 by 12-20%
  // (Zen 5, M = 32..256); 2x4 and 3x3 were slower than both.
  static constexpr int kMxMR = 4, kMxNR = 2;
  static constexpr bool kMxInRegisters = true;
  // MXFP4: GEMV groups up to this many rows (Zen 5, M = 8: 45% of peak, the 6x4 GEMM 37%).
  static constexpr int kMxGemvMaxM = 16;
  // FP8 / INT4: GEMV groups up to this many rows (K2 expert on Zen 5: see simd_impl.h).
  static constexpr int kQuantGemvMaxM = 16;
  static constexpr int kNB = 32;  // panel rows (decoded weights)
  static constexpr int kMB = 96;
  static constexpr int64_t kKB = 512;
  static constexpr int kTM = 6, kTV = 4;  // matmul_t tile: 6 rows x 64 columns
  static constexpr int gemv_rows(int) { return 4; }
  // BF16 / F32 decode (one activation row): eight weight rows side by side, eight streams in
  // flight (8 + 8 + 1 of the 32 registers). One Zen 5 core read Kimi-Linear's and K3's rows
  // 1.27-1.34x faster than with four (docs/PERFORMANCE.md, "The one-row BF16 product").
  static constexpr int gemv_rows_plain(int m) { return m == 1 ? 8 : 4; }
  static constexpr int gemv_rows_mx(int) { return 4; }

  DF_ALWAYS_INLINE static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }
  DF_ALWAYS_INLINE static void in_register(F& v) { asm("" : "+v"(v)); }
  DF_ALWAYS_INLINE static F zero() { return _mm512_setzero_ps(); }
  DF_ALWAYS_INLINE static F set1(float v) { return _mm512_set1_ps(v); }
  DF_ALWAYS_INLINE static F load(const float* p) { return _mm512_loadu_ps(p); }
  DF_ALWAYS_INLINE static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  DF_ALWAYS_INLINE static __mmask16 tail_mask(int n) {
    return static_cast<__mmask16>((1u << n) - 1u);
  }
  // Lanes [0, n) from p, zeros elsewhere; masked-off lanes are not accessed.
  DF_ALWAYS_INLINE static F load_partial(const float* p, int n) {
    return _mm512_maskz_loadu_ps(tail_mask(n), p);
  }
  DF_ALWAYS_INLINE static void store_partial(float* p, F v, int n) {
    _mm512_mask_storeu_ps(p, tail_mask(n), v);
  }
  // Element-wise e^x and tanh (KernelTable::exp/tanh): SLEEF's deterministic 1-ULP functions.
  static F exp(F v) { return Sleef_finz_expf16_u10avx512f(v); }
  static F tanh(F v) { return Sleef_finz_tanhf16_u10avx512f(v); }
  DF_ALWAYS_INLINE static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  DF_ALWAYS_INLINE static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  DF_ALWAYS_INLINE static F add(F a, F b) { return _mm512_add_ps(a, b); }
  DF_ALWAYS_INLINE static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  // Fixed tree: lanes i + (i + 8), then the AVX2 tree on the 8 sums.
  DF_ALWAYS_INLINE static float hsum(F v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  // y[0..3] (+)= hsum(a), hsum(b), hsum(c), hsum(d): each step of hsum's tree (lanes i + (i + 8),
  // then i + (i + 4), i + (i + 2), i + (i + 1), with the same operand order), applied to the
  // four vectors side by side, so every sum is bit-identical to hsum's.
  DF_ALWAYS_INLINE static void hsum4_store(F a, F b, F c, F d, float* y, bool accumulate) {
    const F ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    const F cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    F t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(3, 2, 3, 2)));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 1, 1, 1)));
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    __m128 r = _mm512_castps512_ps128(_mm512_permutexvar_ps(first, t));
    if (accumulate) r = _mm_add_ps(_mm_loadu_ps(y), r);
    _mm_storeu_ps(y, r);
  }
  DF_ALWAYS_INLINE static F load_bf16(const uint16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  DF_ALWAYS_INLINE static F load_i8(const int8_t* p, F scale) {
    __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale);
  }
  // FP8 E4M3FN, 16 codes -> their exact values, as Avx2::load_fp8 (the f16 of code * 2^-8 from
  // the sign-extended code shifted left by 7, NaN codes given the exponent 31, widened, * 2^8).
  DF_ALWAYS_INLINE static F load_fp8(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                 _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
    const __mmask16 nan =
        _mm_cmpeq_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    h = _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7E00));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  }
  // The same without the NaN fix-up and the * 2^8 (code * 2^-8; NaN codes read +-1.875), for
  // blocks fp8_block_has_nan cleared, scaled by scale * 2^8.
  DF_ALWAYS_INLINE static F load_fp8_half(const uint8_t* p) {
    const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBF80))));
  }
  // Whether the 128 codes at p hold a NaN code (0x7F or 0xFF: all seven low bits set).
  DF_ALWAYS_INLINE static bool fp8_block_has_nan(const uint8_t* p) {
    const __m512i hi = _mm512_set1_epi8(static_cast<char>(0x80)), ones = _mm512_set1_epi8(-1);
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
    return (_mm512_cmpeq_epi8_mask(_mm512_or_si512(a, hi), ones) |
            _mm512_cmpeq_epi8_mask(_mm512_or_si512(b, hi), ones)) != 0;
  }
  // INT4 pack-quantized, 16 columns (two 32-bit words; column i of a word in bits 4i..4i+3,
  // stored as q + 8): each word to 8 lanes, shifted, and looked up with vpermps (which reads only
  // an index's low 4 bits: no mask needed) in the group's table int4_group, q * scale for
  // q = -8..7 (each product exact), so no multiply is left per vector.
  DF_ALWAYS_INLINE static F int4_group(float scale) {
    return _mm512_mul_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7),
                         _mm512_set1_ps(scale));
  }
  DF_ALWAYS_INLINE static F load_int4_scaled(const uint8_t* p, F table) {
    const __m512i words = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    return _mm512_permutexvar_ps(
        _mm512_srlv_epi32(
            words, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28)),
        table);
  }
  // MXFP4, four groups (128 columns, 64 bytes) at a time. The block's 4 x 4 dwords (group g,
  // dword u) are transposed so that 128-bit lane u holds dword u of every group; each lane's 16
  // bytes widen to 16 dword lanes, and vpermps, which reads only an index's low 4 bits, looks
  // the low and then the high nibbles up in a 16-float table of doubled E2M1 values. So vector
  // 2u + h, lane 4g + t holds nibble h of byte 4u + t of group g: column
  // 32g + 2 (4u + t) + h, and lanes 4g..4g+3 belong to group g in every vector. 21 operations
  // per 64 bytes, load included (the shuffle-and-unpack decoder needed 26).
  static constexpr int kMxGroups = 4;
  static constexpr bool kMxPermuted = true;
  static constexpr int mx_column(int v, int l) {
    return 32 * (l / 4) + 2 * (4 * (v / 2) + l % 4) + v % 2;
  }
  DF_ALWAYS_INLINE static void mx_decode(const uint8_t* p, F out[8]) {
    const F lut = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i b = _mm512_permutexvar_epi32(tr, _mm512_loadu_si512(p));
    const __m128i q[4] = {_mm512_castsi512_si128(b), _mm512_extracti32x4_epi32(b, 1),
                          _mm512_extracti32x4_epi32(b, 2), _mm512_extracti32x4_epi32(b, 3)};
    DF_UNROLL
    for (int u = 0; u < 4; ++u) {
      const __m512i d = _mm512_cvtepu8_epi32(q[u]);
      out[2 * u] = _mm512_permutexvar_ps(d, lut);
      out[2 * u + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
    }
  }
  // The half scales of the four groups, matching the lanes of mx_decode.
  DF_ALWAYS_INLINE static F mx_scales_f(const float* s) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(s)));
  }
  // The same from the four scale bytes: half_scale_of (simd_impl.h) computed in the vector unit
  // (the float with exponent field e - 1 for e >= 2, the subnormal 0x200000 << e below, NaN for
  // 255); KernelsMxfp4.EveryCodeAndScaleExactInEveryTable holds the two equal for every edge
  // byte. Looked up in kHalfScale instead, four scalar loads and a stack reload per block and row
  // were a fifth of the one-row GEMV's operations, and a 4-lane gather made it 5-15% slower.
  DF_ALWAYS_INLINE static F mx_scales(const uint8_t* e) {
    uint32_t e4;
    std::memcpy(&e4, e, 4);
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m512i ev = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(e4)), shift), _mm512_set1_epi32(0xFF));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(ev, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x200000), ev);
    __m512i r = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(ev, _mm512_set1_epi32(2)), normal,
                                        subnormal);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(ev, _mm512_set1_epi32(255)),
                              _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(r);
  }
};

}  // namespace

// Called by dispatch.cpp only after it has checked the CPU (this file's code must not run first).
const KernelTable& avx512_kernels() {
  static const KernelTable t = Impl<Avx512>::table("avx512");
  return t;
}

}  // namespace deltafin::kernels
