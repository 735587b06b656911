// y[m][y_col + n] = sum_k x[m][k] * W(n, k): the one matrix product of the Vulkan backend,
// compiled by glslc once per weight format (FORMAT 0 = f32, 1 = bf16, 2 = MXFP4, 3 = FP8 E4M3 with
// 128x128 F32 block scales, 4 = INT4 pack-quantized with BF16 group scales) and once more
// per format as the expert-grouped variant (GROUPED: each tile of rows has its own expert's W and
// its own list of x rows).
//
// Exactness: weights are decoded exactly to fp32 (bf16: the high half of a float; MXFP4: the
// E2M1 value times the E8M0 power of two built from its exponent bits, no exp2; FP8: the E4M3
// value built from its bits times the block's scale, one correctly rounded multiply as on the
// CPU; INT4: (nibble - 8) times the BF16 group scale, exact), activations
// are fp32 and every sum is fp32. One workgroup computes one output row n for up to TM rows of
// x: thread t accumulates k = t, t + 64, ... in ascending order, then a fixed tree over the 64
// partial sums. So an element's result does not depend on M, TM, the tile or the grouping
// (GEMV, GEMM and grouped GEMM agree bit for bit on one device).
//
// Addresses are byte offsets into 32-bit words, so a matrix may start at any byte (bf16 rows of
// odd length, MXFP4 rows of 16 bytes, tensors at unaligned file offsets).
#version 450

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint TM = 8;  // x rows per workgroup (<= 16)

layout(std430, binding = 0) readonly buffer Wbuf { uint w[]; };
layout(std430, binding = 1) readonly buffer Sbuf { uint s[]; };
layout(std430, binding = 2) readonly buffer Xbuf { float x[]; };
layout(std430, binding = 3) writeonly buffer Ybuf { float y[]; };
#if GROUPED
// tiles[3t..3t+2] = expert (index into this dispatch's W), first grouped row, rows (<= TM)
layout(std430, binding = 4) readonly buffer Tbuf { uint tiles[]; };
// the x row of each grouped row; y is dense over grouped rows
layout(std430, binding = 5) readonly buffer Rbuf { uint rows[]; };
#endif

layout(push_constant) uniform Params {
  uint N;         // rows of W in this dispatch
  uint K;         // columns of W = length of an x row
  uint M;         // x rows (GROUPED: unused)
  uint w_off;     // byte offset of W(0, 0) in w
  uint s_off;     // byte offset of the first scale row in s (MXFP4)
  uint ldx;       // floats between x rows
  uint ldy;       // floats between y rows
  uint y_col;     // y column of W's row 0
  uint expert_w;  // GROUPED: bytes between experts in w
  uint expert_s;  // GROUPED: bytes between experts in s
  uint row_phase; // FP8: row 0's row within its 128-row scale block
} p;

shared float red[16 * 64];

// E2M1 codes (bit 3 = sign), as tensor/matrix.cpp's kE2M1Values
const float kE2M1[16] = float[16](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5,
                                  -2.0, -3.0, -4.0, -6.0);

uint byte_at(uint b) {
  return (w[b >> 2] >> ((b & 3u) * 8u)) & 0xFFu;
}

// Bytes of the scale buffer, at any byte offset (scales may start anywhere in a file).
uint s_byte(uint b) {
  return (s[b >> 2] >> ((b & 3u) * 8u)) & 0xFFu;
}
uint s_u16(uint b) {
  return s_byte(b) | (s_byte(b + 1u) << 8);
}
uint s_u32(uint b) {
  return (b & 3u) == 0u ? s[b >> 2] : s_u16(b) | (s_u16(b + 2u) << 16);
}

// FP8 E4M3FN code -> value, exact (tensor/matrix.h: e4m3_to_float): (8 + m) 2^(e - 10) from its
// bits, m 2^-9 for e = 0, NaN for 0x7F and 0xFF.
float e4m3(uint c) {
  const uint e = (c >> 3) & 15u, m = c & 7u;
  float a = e == 0u ? float(m) * (1.0 / 512.0) : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
  if (e == 15u && m == 7u) a = uintBitsToFloat(0x7FC00000u);
  return (c & 0x80u) != 0u ? -a : a;
}

float weight(uint wbase, uint sbase, uint n, uint k) {
#if FORMAT == 0
  return uintBitsToFloat(w[(wbase + (n * p.K + k) * 4u) >> 2]);
#elif FORMAT == 1
  uint b = wbase + (n * p.K + k) * 2u;
  uint word = w[b >> 2];
  uint h = (b & 2u) != 0u ? (word >> 16) : (word & 0xFFFFu);
  return uintBitsToFloat(h << 16);
#elif FORMAT == 3
  const uint code = byte_at(wbase + n * p.K + k);
  const uint sb = sbase + (((p.row_phase + n) / 128u) * ((p.K + 127u) / 128u) + k / 128u) * 4u;
  return e4m3(code) * uintBitsToFloat(s_u32(sb));
#elif FORMAT == 4
  uint code = byte_at(wbase + n * ((p.K + 7u) / 8u * 4u) + k / 2u);
  code = (k & 1u) != 0u ? (code >> 4) : (code & 0xFu);
  const uint sb = sbase + (n * ((p.K + 31u) / 32u) + k / 32u) * 2u;
  return float(int(code) - 8) * uintBitsToFloat(s_u16(sb) << 16);
#else
  uint code = byte_at(wbase + n * (p.K / 2u) + k / 2u);
  code = (k & 1u) != 0u ? (code >> 4) : (code & 0xFu);
  uint sb = sbase + n * (p.K / 32u) + k / 32u;
  uint e = (s[sb >> 2] >> ((sb & 3u) * 8u)) & 0xFFu;
  // 2^(e-127) exactly: the float whose exponent field is e (e = 0: 2^-127, a subnormal;
  // e = 255: NaN, as the CPU decodes it).
  float scale = e == 0u ? uintBitsToFloat(0x00400000u)
                        : (e == 255u ? uintBitsToFloat(0x7FC00000u) : uintBitsToFloat(e << 23));
  return kE2M1[code] * scale;
#endif
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint n = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (n >= p.N) return;  // uniform over the workgroup
#if GROUPED
  const uint t = gl_WorkGroupID.y;
  const uint expert = tiles[3u * t];
  const uint r0 = tiles[3u * t + 1u];
  const uint mc = tiles[3u * t + 2u];
  const uint wbase = p.w_off + expert * p.expert_w;
  const uint sbase = p.s_off + expert * p.expert_s;
#else
  const uint r0 = gl_WorkGroupID.y * TM;
  const uint mc = min(TM, p.M - r0);
  const uint wbase = p.w_off;
  const uint sbase = p.s_off;
#endif
  uint xrow[16];
  float acc[16];
  for (uint i = 0u; i < TM; ++i) {
    acc[i] = 0.0;
#if GROUPED
    xrow[i] = i < mc ? rows[r0 + i] * p.ldx : 0u;
#else
    xrow[i] = (r0 + min(i, mc - 1u)) * p.ldx;
#endif
  }
  for (uint k = lid; k < p.K; k += 64u) {
    const float wv = weight(wbase, sbase, n, k);
    for (uint i = 0u; i < TM; ++i) {
      if (i < mc) acc[i] += x[xrow[i] + k] * wv;
    }
  }
  for (uint i = 0u; i < TM; ++i) red[i * 64u + lid] = acc[i];
  barrier();
  for (uint half_ = 32u; half_ > 0u; half_ >>= 1) {
    if (lid < half_) {
      for (uint i = 0u; i < TM; ++i) red[i * 64u + lid] += red[i * 64u + lid + half_];
    }
    barrier();
  }
  if (lid < mc) y[(r0 + lid) * p.ldy + p.y_col + n] = red[lid * 64u];
}
