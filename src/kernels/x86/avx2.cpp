// AVX2 + FMA kernels (x86-64), compiled with -mavx2 -mfma -mf16c for this file only. The
// algorithms live in kernels/simd_impl.h (shared with AVX-512 and NEON); this file supplies the
// 8-lane vector traits: bf16 -> f32 by zero-extension and a 16-bit shift, int8 by sign-extension
// and conversion, MXFP4 by pshufb lookups of the bf16 bytes of doubled E2M1 values, two groups per
// 256-bit vector in an order that needs no lane-crossing shuffle (x is permuted to match; see
// mx_decode), FP8 E4M3 through F16C (load_fp8), INT4 by variable shifts of one word. The register
// budget (16 ymm) sets the tiles: 6x2 accumulators for the plain micro-kernel and for the MXFP4
// half sums (the MXFP4 accumulators live in L1).
#include <immintrin.h>
#include <sleef.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/simd_impl.h"

namespace deltafin::kernels {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int L = 8;
  static constexpr int kMR = 6, kNR = 2;      // plain micro-kernel tile
  static constexpr int kMxMR = 6, kMxNR = 2;  // MXFP4 micro-kernel tile
  static constexpr bool kMxInRegisters = false;
  static constexpr int kMxGemvMaxM = 16;     // MXFP4: GEMV groups up to this many rows
  static constexpr int kQuantGemvMaxM = 16;  // FP8 / INT4: the same
  static constexpr int kNB = 32;             // panel rows (decoded weights, in L1/L2)
  static constexpr int kMB = 96;             // activation rows per block
  static constexpr int64_t kKB = 512;        // panel columns
  static constexpr int kTM = 4, kTV = 3;     // matmul_t tile: 4 rows x 24 columns
  static constexpr int gemv_rows(int m) { return m <= 2 ? 4 : 3; }
  static constexpr int gemv_rows_mx(int m) { return m <= 2 ? 4 : 2; }

  DF_ALWAYS_INLINE static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }
  // Keeps v in a register: GCC otherwise folds the load into every FMA that uses it, which
  // multiplies the loads per step in the micro-kernels.
  DF_ALWAYS_INLINE static void in_register(F& v) { asm("" : "+x"(v)); }
  DF_ALWAYS_INLINE static F zero() { return _mm256_setzero_ps(); }
  DF_ALWAYS_INLINE static F set1(float v) { return _mm256_set1_ps(v); }
  DF_ALWAYS_INLINE static F load(const float* p) { return _mm256_loadu_ps(p); }
  DF_ALWAYS_INLINE static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  DF_ALWAYS_INLINE static __m256i tail_mask(int n) {
    alignas(32) static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                              0,  0,  0,  0,  0,  0,  0,  0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 - n));
  }
  // Lanes [0, n) from p, zeros elsewhere; nothing past p + n is touched.
  DF_ALWAYS_INLINE static F load_partial(const float* p, int n) {
    return _mm256_maskload_ps(p, tail_mask(n));
  }
  DF_ALWAYS_INLINE static void store_partial(float* p, F v, int n) {
    _mm256_maskstore_ps(p, tail_mask(n), v);
  }
  // Element-wise e^x and tanh (KernelTable::exp/tanh): SLEEF's deterministic 1-ULP functions.
  static F exp(F v) { return Sleef_finz_expf8_u10avx2(v); }
  static F tanh(F v) { return Sleef_finz_tanhf8_u10avx2(v); }
  DF_ALWAYS_INLINE static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  DF_ALWAYS_INLINE static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  DF_ALWAYS_INLINE static F add(F a, F b) { return _mm256_add_ps(a, b); }
  DF_ALWAYS_INLINE static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  // Fixed tree: (v0+v4) (v1+v5) (v2+v6) (v3+v7) -> ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
  DF_ALWAYS_INLINE static float hsum(F v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  DF_ALWAYS_INLINE static F load_bf16(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  DF_ALWAYS_INLINE static F load_i8(const int8_t* p, F scale) {
    __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
  }
  // FP8 E4M3FN, 8 codes -> their exact values. Sign-extending a code to 16 bits and shifting it
  // left by 7 puts its sign at bit 15 (and, masked off, at bit 14) and its exponent and mantissa
  // at bits 13..7: the f16 of code * 2^-8 for every code, subnormals included (f16's exponent
  // bias is 8 more than E4M3's). The two NaN codes (magnitude 0x7F) would read 1.875: they get
  // the f16 exponent 31 instead. F16C widens, and * 2^8 is exact.
  DF_ALWAYS_INLINE static F load_fp8(const uint8_t* p) {
    const __m128i mag = _mm_set1_epi16(0x3F80);
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<int16_t>(0xBF80)));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, mag), mag);
    h = _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x4000)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  }
  // The same without the NaN fix-up and the * 2^8: code * 2^-8 (NaN codes read +-1.875), for
  // blocks fp8_block_has_nan cleared, scaled by scale * 2^8.
  DF_ALWAYS_INLINE static F load_fp8_half(const uint8_t* p) {
    const __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(
        _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<int16_t>(0xBF80))));
  }
  // Whether the 128 codes at p hold a NaN code (0x7F or 0xFF: all seven low bits set).
  DF_ALWAYS_INLINE static bool fp8_block_has_nan(const uint8_t* p) {
    const __m256i hi = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi8(-1);
    __m256i any = _mm256_setzero_si256();
    DF_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
      any = _mm256_or_si256(any, _mm256_cmpeq_epi8(_mm256_or_si256(b, hi), ones));
    }
    return !_mm256_testz_si256(any, any);
  }
  // INT4 pack-quantized, 8 columns (one 32-bit word, column i in bits 4i..4i+3, stored as
  // q + 8) -> q as floats, in column order.
  DF_ALWAYS_INLINE static F load_int4(const uint8_t* p) {
    uint32_t word;
    std::memcpy(&word, p, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(
        _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xF)), _mm256_set1_epi32(8)));
  }
  // INT4 with its group's scale: q * scale (exact), int4_group being the scale in every lane.
  DF_ALWAYS_INLINE static F int4_group(float scale) { return _mm256_set1_ps(scale); }
  DF_ALWAYS_INLINE static F load_int4_scaled(const uint8_t* p, F g) {
    return _mm256_mul_ps(load_int4(p), g);
  }
  // MXFP4, two groups (64 columns, 32 bytes) at a time, without lane-crossing shuffles: each
  // 128-bit half decodes one group. Two pshufb per nibble half look up the high and the low byte
  // of the bf16 pattern of the doubled E2M1 value (0, ±1 ... ±12 are exact in bf16); unpacking
  // low/high bytes gives 16 bf16 words per vector, and bf16 -> f32 is a 16-bit shift (even
  // words) or a mask (odd words). That is 8 shuffles per 64 columns (the magic-number form took
  // 14 plus 8 subtractions, and the GEMV was bound by them). Vector v, lane l holds column
  // mx_column(v, l): lanes 0..3 group 0, lanes 4..7 group 1; v / 4 is the nibble (even/odd
  // column), (v / 2) % 2 the byte half, v % 2 the word parity.
  static constexpr int kMxGroups = 2;
  static constexpr bool kMxPermuted = true;
  static constexpr int mx_column(int v, int l) {
    return 32 * (l / 4) + 16 * ((v / 2) % 2) + 4 * (l % 4) + 2 * (v % 2) + v / 4;
  }
  DF_ALWAYS_INLINE static void mx_decode(const uint8_t* p, F out[8]) {
    // bf16 of 0, 1, 2, 3, 4, 6, 8, 12, then the negatives (code 8, "-0", decodes as +0).
    alignas(32) static constexpr uint8_t kHi[32] = {0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41,
                                                    0x00, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1,
                                                    0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41,
                                                    0x00, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1};
    alignas(32) static constexpr uint8_t kLo[32] = {0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                                    0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                                    0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                                    0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40};
    const __m256i hi_lut = _mm256_load_si256(reinterpret_cast<const __m256i*>(kHi));
    const __m256i lo_lut = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLo));
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i top = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i even = _mm256_and_si256(b, nib);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(b, 4), nib);
    const __m256i el = _mm256_shuffle_epi8(lo_lut, even), eh = _mm256_shuffle_epi8(hi_lut, even);
    const __m256i ol = _mm256_shuffle_epi8(lo_lut, odd), oh = _mm256_shuffle_epi8(hi_lut, odd);
    const __m256i w[4] = {_mm256_unpacklo_epi8(el, eh), _mm256_unpackhi_epi8(el, eh),
                          _mm256_unpacklo_epi8(ol, oh), _mm256_unpackhi_epi8(ol, oh)};
    DF_UNROLL
    for (int j = 0; j < 4; ++j) {
      out[2 * j] = _mm256_castsi256_ps(_mm256_slli_epi32(w[j], 16));
      out[2 * j + 1] = _mm256_castsi256_ps(_mm256_and_si256(w[j], top));
    }
  }
  // The half scales of the two groups (from the values, or from the E8M0 bytes), matching the
  // lanes of mx_decode.
  DF_ALWAYS_INLINE static F mx_scales_f(const float* s) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s[0])), _mm_set1_ps(s[1]), 1);
  }
  DF_ALWAYS_INLINE static F mx_scales(const uint8_t* e) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(&kHalfScale.v[e[0]])),
                                _mm_broadcast_ss(&kHalfScale.v[e[1]]), 1);
  }
};

}  // namespace

// Called by dispatch.cpp only after it has checked the CPU (this file's code must not run first).
const KernelTable& avx2_kernels() {
  static const KernelTable t = Impl<Avx2>::table("avx2");
  return t;
}

}  // namespace deltafin::kernels
