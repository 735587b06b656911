// AVX2 + FMA kernels (x86-64), compiled with -mavx2 -mfma -mf16c for this file only. The
// algorithms live in kernels/simd_impl.h (shared with AVX-512 and NEON); this file supplies the
// 8-lane vector traits: bf16 -> f32 by zero-extension and a 16-bit shift, int8 by sign-extension
// and conversion, MXFP4 by a pshufb lookup of doubled E2M1 values (exact small integers) with
// low/high nibbles interleaved back into column order. Register budget (16 ymm) sets the tiles:
// 6x2 accumulators for the plain micro-kernel, 3x2 (+3x2 group sums) for MXFP4.
#include <immintrin.h>

#include "kernels/kernels.h"
#include "kernels/simd_impl.h"

namespace deltafin::kernels {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int L = 8;
  static constexpr int kMR = 6, kNR = 2;      // plain micro-kernel tile
  static constexpr int kMxMR = 3, kMxNR = 2;  // MXFP4 micro-kernel tile
  static constexpr int kMB = 96;              // activation rows per block
  static constexpr int64_t kKB = 256;         // panel columns
  static constexpr int kTM = 4, kTV = 3;      // matmul_t tile: 4 rows x 24 columns
  static constexpr int gemv_rows(int m) { return m <= 2 ? 4 : 3; }
  static constexpr int gemv_rows_mx(int m) { return m <= 2 ? 4 : 2; }

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static __m256i tail_mask(int n) {
    alignas(32) static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 - n));
  }
  // Lanes [0, n) from p, zeros elsewhere; nothing past p + n is touched.
  static F load_partial(const float* p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
  static void store_partial(float* p, F v, int n) { _mm256_maskstore_ps(p, tail_mask(n), v); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  // Fixed tree: (v0+v4) (v1+v5) (v2+v6) (v3+v7) -> ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
  static float hsum(F v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  static F load_bf16(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F load_i8(const int8_t* p, F scale) {
    __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
  }
  // 16 packed bytes (32 columns) -> 4 vectors of doubled E2M1 values in column order.
  static void mx_decode(const uint8_t* p, F out[4]) {
    const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kE2M1x2));
    const __m128i nib = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, nib));                     // even columns
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), nib));  // odd columns
    __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // columns 0..15
    __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // columns 16..31
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)));
  }
};

}  // namespace

// Called by dispatch.cpp only after it has checked the CPU (this file's code must not run first).
const KernelTable& avx2_kernels() {
  static const KernelTable t = Impl<Avx2>::table("avx2");
  return t;
}

}  // namespace deltafin::kernels
