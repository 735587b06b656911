// NEON kernels (AArch64, where NEON is baseline: no extra flags). The algorithms are those of
// kernels/simd_impl.h, shared with AVX2 and AVX-512; this file supplies the 4-lane traits: bf16 ->
// f32 by a widening 16-bit shift (vshll), int8 by two widenings and a conversion, MXFP4 by a tbl
// lookup of doubled E2M1 values with low/high nibbles zipped back into column order. 32 q
// registers allow 6x4 plain tiles and 3x4 (+ 2 x 2x4 partial sums) MXFP4 tiles. tools/test-neon.sh
// cross-builds the kernel tests and runs them under qemu-aarch64.
#include <arm_neon.h>
#include <math.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/simd_impl.h"

namespace deltafin::kernels {
namespace {

struct Neon {
  using F = float32x4_t;
  static constexpr int L = 4;
  static constexpr int kMR = 6, kNR = 4;
  static constexpr int kMxMR = 2, kMxNR = 4;
  static constexpr bool kMxInRegisters = false;
  static constexpr int kMxGemvMaxM = 4;  // MXFP4: GEMV groups up to this many rows
  static constexpr int kNB = 32;         // panel rows (decoded weights)
  static constexpr int kMB = 96;
  static constexpr int64_t kKB = 512;
  static constexpr int kTM = 6, kTV = 4;  // matmul_t tile: 6 rows x 16 columns
  static constexpr int gemv_rows(int) { return 4; }
  static constexpr int gemv_rows_mx(int) { return 4; }

  DF_ALWAYS_INLINE static void prefetch(const void* p) { __builtin_prefetch(p); }
  DF_ALWAYS_INLINE static void in_register(F& v) { asm("" : "+w"(v)); }
  DF_ALWAYS_INLINE static F zero() { return vdupq_n_f32(0.0f); }
  DF_ALWAYS_INLINE static F set1(float v) { return vdupq_n_f32(v); }
  DF_ALWAYS_INLINE static F load(const float* p) { return vld1q_f32(p); }
  DF_ALWAYS_INLINE static void store(float* p, F v) { vst1q_f32(p, v); }
  DF_ALWAYS_INLINE static F load_partial(const float* p, int n) {
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    std::memcpy(t, p, static_cast<size_t>(n) * sizeof(float));
    return vld1q_f32(t);
  }
  DF_ALWAYS_INLINE static void store_partial(float* p, F v, int n) {
    float t[4];
    vst1q_f32(t, v);
    std::memcpy(p, t, static_cast<size_t>(n) * sizeof(float));
  }
  // Element-wise e^x and tanh (KernelTable::exp/tanh): libm per lane, the scalar table's values.
  static F exp(F v) { return lanes<expf>(v); }
  static F tanh(F v) { return lanes<tanhf>(v); }
  template <float (*Fn)(float)>
  static F lanes(F v) {
    float a[4];
    vst1q_f32(a, v);
    for (float& e : a) e = Fn(e);
    return vld1q_f32(a);
  }
  DF_ALWAYS_INLINE static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  DF_ALWAYS_INLINE static F mul(F a, F b) { return vmulq_f32(a, b); }
  DF_ALWAYS_INLINE static F add(F a, F b) { return vaddq_f32(a, b); }
  DF_ALWAYS_INLINE static F bcast(const float* p) { return vld1q_dup_f32(p); }
  // Fixed tree: (v0+v2) + (v1+v3).
  DF_ALWAYS_INLINE static float hsum(F v) {
    float32x2_t t = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
  }
  DF_ALWAYS_INLINE static F load_bf16(const uint16_t* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
  }
  DF_ALWAYS_INLINE static F load_i8(const int8_t* p, F scale) {
    uint32_t four;
    std::memcpy(&four, p, 4);
    int16x8_t h = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four)));
    return vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), scale);
  }
  // MXFP4 one group at a time, in natural column order (widening moves are cheap here).
  static constexpr int kMxGroups = 1;
  static constexpr bool kMxPermuted = false;
  static constexpr int mx_column(int v, int l) { return 4 * v + l; }
  DF_ALWAYS_INLINE static F mx_scales_f(const float* s) { return vdupq_n_f32(s[0]); }
  DF_ALWAYS_INLINE static F mx_scales(const uint8_t* e) {
    return vld1q_dup_f32(&kHalfScale.v[e[0]]);
  }
  // 16 packed bytes (32 columns) -> 8 vectors of doubled E2M1 values in column order.
  DF_ALWAYS_INLINE static void mx_decode(const uint8_t* p, F out[8]) {
    const int8x16_t lut = vld1q_s8(kE2M1x2);
    uint8x16_t b = vld1q_u8(p);
    int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(b, vdupq_n_u8(0x0F)));  // even columns
    int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));               // odd columns
    int8x16_t e[2] = {vzip1q_s8(lo, hi), vzip2q_s8(lo, hi)};        // columns 0..15, 16..31
    for (int j = 0; j < 2; ++j) {
      int16x8_t h0 = vmovl_s8(vget_low_s8(e[j]));
      int16x8_t h1 = vmovl_high_s8(e[j]);
      out[4 * j + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h0)));
      out[4 * j + 1] = vcvtq_f32_s32(vmovl_high_s16(h0));
      out[4 * j + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h1)));
      out[4 * j + 3] = vcvtq_f32_s32(vmovl_high_s16(h1));
    }
  }
};

}  // namespace

// Called by dispatch.cpp after its CPU check.
const KernelTable& neon_kernels() {
  static const KernelTable t = Impl<Neon>::table("neon");
  return t;
}

}  // namespace deltafin::kernels
