// NEON kernels (AArch64, where NEON is baseline: no extra flags). The algorithms are those of
// kernels/simd_impl.h, shared with AVX2 and AVX-512; this file supplies the 4-lane traits: bf16 ->
// f32 by a widening 16-bit shift (vshll), int8 by two widenings and a conversion, MXFP4 by a tbl
// lookup of doubled E2M1 values with low/high nibbles zipped back into column order, FP8 E4M3
// through the f16 converter, INT4 by shifts of a broadcast half word. 32 q
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
  static constexpr int kMxGemvMaxM = 4;     // MXFP4: GEMV groups up to this many rows
  static constexpr int kQuantGemvMaxM = 4;  // FP8 / INT4: the same (not measured on ARM)
  static constexpr int kNB = 32;            // panel rows (decoded weights)
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
  // FP8 E4M3FN, 4 codes -> their exact values, as Avx2::load_fp8: the f16 of code * 2^-8 from the
  // sign-extended code shifted left by 7 (NaN codes given the exponent 31), widened, * 2^8.
  DF_ALWAYS_INLINE static F load_fp8(const uint8_t* p) {
    uint32_t four;
    std::memcpy(&four, p, 4);
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four)));
    uint16x4_t h =
        vand_u16(vshl_n_u16(vreinterpret_u16_s16(vget_low_s16(wide)), 7), vdup_n_u16(0xBF80));
    const uint16x4_t nan = vceq_u16(vand_u16(h, vdup_n_u16(0x3F80)), vdup_n_u16(0x3F80));
    h = vorr_u16(h, vand_u16(nan, vdup_n_u16(0x4000)));
    return vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), vdupq_n_f32(256.0f));
  }
  // The same without the NaN fix-up and the * 2^8 (code * 2^-8; NaN codes read +-1.875), for
  // blocks fp8_block_has_nan cleared, scaled by scale * 2^8.
  DF_ALWAYS_INLINE static F load_fp8_half(const uint8_t* p) {
    uint32_t four;
    std::memcpy(&four, p, 4);
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four)));
    const uint16x4_t h =
        vand_u16(vshl_n_u16(vreinterpret_u16_s16(vget_low_s16(wide)), 7), vdup_n_u16(0xBF80));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
  }
  // Whether the 128 codes at p hold a NaN code (0x7F or 0xFF: all seven low bits set).
  DF_ALWAYS_INLINE static bool fp8_block_has_nan(const uint8_t* p) {
    uint8x16_t any = vdupq_n_u8(0);
    for (int i = 0; i < 8; ++i)
      any = vorrq_u8(any,
                     vceqq_u8(vorrq_u8(vld1q_u8(p + 16 * i), vdupq_n_u8(0x80)), vdupq_n_u8(0xFF)));
    return vmaxvq_u8(any) != 0;
  }
  // INT4 pack-quantized, 4 columns (two bytes, low nibble first, stored as q + 8) -> q as floats.
  DF_ALWAYS_INLINE static F load_int4(const uint8_t* p) {
    uint16_t two;
    std::memcpy(&two, p, 2);
    const int32x4_t shifts = {0, -4, -8, -12};
    const uint32x4_t v = vandq_u32(vshlq_u32(vdupq_n_u32(two), shifts), vdupq_n_u32(0xF));
    return vcvtq_f32_s32(vsubq_s32(vreinterpretq_s32_u32(v), vdupq_n_s32(8)));
  }
  // INT4 with its group's scale: q * scale (exact), int4_group being the scale in every lane.
  DF_ALWAYS_INLINE static F int4_group(float scale) { return vdupq_n_f32(scale); }
  DF_ALWAYS_INLINE static F load_int4_scaled(const uint8_t* p, F g) {
    return vmulq_f32(load_int4(p), g);
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
