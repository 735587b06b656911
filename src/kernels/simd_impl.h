// The SIMD matrix kernels, written once over a small vector-traits type `V` and included by each
// ISA's translation unit (x86/avx2.cpp, x86/avx512.cpp, arm/neon.cpp), which supplies V (vector
// type, lane count, loads, FMA, a fixed-order horizontal sum, bf16/int8/MXFP4 decoders, tile
// sizes). One algorithm means the AVX-512 table, on a machine without AVX-512, is still the same
// code that the AVX2 and NEON tables run in the tests, with only the traits differing.
//
// Summation order (what makes results reproducible). For every output element y[m, n] of
// `matmul`, and for every table:
//   plain formats (f32, bf16, int8): lane j of one accumulator vector sums x[k] * W(n, k) over
//     k = j, j + L, j + 2L, ... in ascending order with FMA (the last partial vector has zeros in
//     its unused lanes), and the lanes are then added in the traits' fixed tree (V::hsum);
//   MXFP4: a block of V::kMxGroups groups (32 columns each) decodes into vectors of doubled E2M1
//     codes (exact integers -12..12) whose lanes hold the block's columns in the order
//     V::mx_column gives (chosen so the decoder needs no lane-crossing shuffle; x is permuted to
//     match, and each lane belongs to one group). Per block, ga = sum of x * code over the even
//     vectors, gb over the odd ones (first product a plain multiply, then FMAs), and
//     acc = fma(ga + gb, s, acc), where each lane of s is its group's 2^(e - 128); then hsum.
//     Scaling by a power of two commutes with rounding, so this is the exact decoded weight
//     W = E2M1 * 2^(e - 127) up to overflow/underflow, which behave like the reference's.
//   FP8 (block-scaled E4M3) and INT4 (pack-quantized) are plain formats: each vector of weights is
//     first decoded exactly to the float32 weight the reference defines (FP8: the code's exact
//     value, from the f16 whose bits are the code's shifted by 7, times 2^8, then one multiply
//     by the block's F32 scale; INT4: nibble - 8 times the group's BF16 scale, exact), then
//     summed like f32 weights. No scale is factored out of a sum: these scales are not powers of
//     two, so that would change the rounding.
// The small-M path (M <= 4: each weight row streamed once, decoded in registers) and the large-M
// path (register-blocked micro-kernel over K blocks; f32 and bf16 read W in place and widen it
// in registers, MXFP4 and int8 first decode a panel of W into a per-thread f32 buffer)
// perform exactly these operations, so y[m, n] depends on neither the thread count, nor n0/n1,
// nor M, nor the other rows of x: a token gets bit-identical outputs alone or in any batch.
//
// `matmul_t` (y += x * W, W's rows are the input) sums sequentially over W's rows with FMA into
// y, vectorised over columns (for M <= 4 straight from W's rows, otherwise from an exactly decoded
// panel); again independent of the split, of M and of the path.
//
// Everything here has internal linkage (anonymous namespace, and every template depends on the
// TU-local V), and no standard-library template that could emit an out-of-line copy is used:
// otherwise the linker could pick an AVX-512-compiled copy of a shared inline function for code
// that runs on any CPU.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

// The traits' one-line functions and the per-vector helpers must inline into the loops (GCC
// otherwise keeps e.g. the MXFP4 decoder out of line and round-trips its vectors through memory).
#define DF_ALWAYS_INLINE inline __attribute__((always_inline))
// Loops over a tile's rows/columns/vectors (compile-time trip counts) must be unrolled so that
// their accumulators live in registers, not in a stack array (GCC keeps such loops rolled when
// the body is large).
#define DF_UNROLL _Pragma("GCC unroll 16")
// The same for a lambda the loops call.
#define DF_ALWAYS_INLINE_LAMBDA __attribute__((always_inline))

namespace deltafin::kernels {
namespace {

constexpr int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
constexpr int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

// Accumulator chains of the FMA-peak loop (Impl::fma_loop).
constexpr int kPeakChains = 12;

// Compile-time loop: f(integral_constant<int, I>) for I in [1, N].
template <int N, class Fn>
inline void static_for(Fn&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I + 1>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

// Calls f(integral_constant<mr>, integral_constant<nr>) for runtime 1 <= mr <= MR, 1 <= nr <= NR.
template <int MR, int NR, class Fn>
inline void with_tile(int mr, int nr, Fn&& f) {
  static_for<MR>([&](auto m) {
    if (decltype(m)::value == mr) {
      static_for<NR>([&](auto n) {
        if (decltype(n)::value == nr) f(m, n);
      });
    }
  });
}

// 2^(e - 128): half the E8M0 scale, because the decoders produce doubled E2M1 values (integers
// -12..12). e = 0 and 1 are subnormal floats (2^-128, 2^-127), not zero; e = 255 is NaN.
constexpr float half_scale_of(int e) {
  uint32_t bits = e == 255 ? 0x7fc00000u
                  : e >= 2 ? static_cast<uint32_t>(e - 1) << 23
                           : (e == 1 ? 0x00400000u : 0x00200000u);
  return std::bit_cast<float>(bits);
}
struct HalfScaleTable {
  float v[256];
  constexpr HalfScaleTable() : v{} {
    for (int e = 0; e < 256; ++e) v[e] = half_scale_of(e);
  }
};
constexpr HalfScaleTable kHalfScale{};

// Doubled E2M1 values, code -> int8 (the pshufb / tbl lookup table).
alignas(16) constexpr int8_t kE2M1x2[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// FP8 E4M3FN code -> value (matrix.h: e4m3_to_float), for the lanes of a tail.
constexpr float e4m3_value(int c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  float a = e == 0 ? static_cast<float>(m) * 0.001953125f  // m * 2^-9
                   : std::bit_cast<float>(static_cast<uint32_t>(e + 120) << 23 |
                                          static_cast<uint32_t>(m) << 20);
  if (e == 15 && m == 7) a = std::bit_cast<float>(0x7fc00000u);
  return (c & 0x80) ? -a : a;
}
struct E4M3Table {
  float v[256];
  constexpr E4M3Table() : v{} {
    for (int c = 0; c < 256; ++c) v[c] = e4m3_value(c);
  }
};
constexpr E4M3Table kE4M3{};

template <WeightFormat Fmt>
constexpr bool kQuantized = Fmt == WeightFormat::kFP8 || Fmt == WeightFormat::kInt4;

// A per-thread, 64-byte aligned, growing buffer.
struct Scratch {
  void* p = nullptr;
  size_t cap = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p); }
  float* floats(int64_t count) {
    size_t bytes = static_cast<size_t>(count) * sizeof(float);
    if (bytes > cap) {
      std::free(p);
      cap = static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 4096));
      p = std::aligned_alloc(64, cap);
      if (p == nullptr) {
        cap = 0;
        throw std::bad_alloc();
      }
    }
    return static_cast<float*>(p);
  }
};
thread_local Scratch t_panel;   // decoded weight panel
thread_local Scratch t_scales;  // MXFP4 panel scales
thread_local Scratch t_acc;     // accumulator vectors carried between K blocks
thread_local Scratch t_xpack;   // x in the MXFP4 decoder's column order

template <class V>
struct Impl {
  using F = typename V::F;
  static constexpr int L = V::L;
  static constexpr int kNB = V::kNB;      // output rows per decoded panel
  static constexpr int64_t kKB = V::kKB;  // columns per panel (multiple of L and 32)
  static constexpr int kMB = V::kMB;      // activation rows per block (multiple of kMR, kMxMR)
  // MXFP4 is decoded a block at a time: kBG groups (kBC columns) into kNV vectors, whose lanes
  // hold the block's columns in the order V::mx_column gives (a permutation that keeps the
  // decoder free of lane-crossing shuffles); x is permuted the same way (pack_x_mx) unless the
  // traits say the order is the natural one.
  static constexpr int kBG = V::kMxGroups;
  static constexpr int kBC = 32 * kBG;
  static constexpr int kNV = kBC / L;
  static constexpr bool kPermuted = V::kMxPermuted;
  static_assert(kKB % L == 0 && kKB % kBC == 0 && 32 % L == 0 && kNV % 2 == 0);

  // ---- one row of a plain-format weight matrix --------------------------------------------
  template <WeightFormat Fmt>
  struct Row {
    const uint8_t* p = nullptr;
    const uint8_t* sp = nullptr;  // FP8 / INT4: the row's scales
    float s = 1.0f;               // int8 row scale
    F sv;
    void init(const Matrix& w, int64_t n) {
      p = static_cast<const uint8_t*>(w.data) + n * w.row_bytes();
      if constexpr (Fmt == WeightFormat::kInt8) {
        uint16_t b;
        std::memcpy(&b, w.scales + n * 2, 2);
        s = f16_to_f32(b);
      } else if constexpr (kQuantized<Fmt>) {
        sp = w.scale_row(n);
      }
      sv = V::set1(s);
    }
    // FP8 / INT4: the scale of the block (128 columns) or group (32) that holds column k.
    DF_ALWAYS_INLINE float block_scale(int64_t k) const {
      if constexpr (Fmt == WeightFormat::kFP8) {
        float v;
        std::memcpy(&v, sp + k / kFp8Block * 4, 4);
        return v;
      } else {
        uint16_t h;
        std::memcpy(&h, sp + k / kInt4Group * 2, 2);
        return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
    }
    // FP8 / INT4: what load_scaled needs of the block or group that holds column k: FP8 its
    // scale in every lane; INT4 what the traits' decoder takes (V::int4_group: the scale, or a
    // table of q * scale).
    DF_ALWAYS_INLINE F group_vec(int64_t k) const {
      if constexpr (Fmt == WeightFormat::kFP8) {
        return V::set1(block_scale(k));
      } else {
        return V::int4_group(block_scale(k));
      }
    }
    // FP8 / INT4: the decoded weights of columns [k, k + L), k a multiple of L (so the vector
    // lies in one block or group), given group_vec of that block.
    DF_ALWAYS_INLINE F load_scaled(int64_t k, F g) const {
      if constexpr (Fmt == WeightFormat::kFP8) {
        return V::mul(V::load_fp8(p + k), g);
      } else {
        return V::load_int4_scaled(p + k / 2, g);
      }
    }
    // FP8, the fast path of a whole block at column k (a multiple of 128) with scale s: when the
    // block holds no NaN code and s * 2^8 does not overflow, each vector is the f16-decoded code *
    // 2^-8 (V::load_fp8_half) times s * 2^8 — the same exact product, rounded once, as
    // load_scaled's code * s, without its NaN fix-up and its multiply by 2^8.
    DF_ALWAYS_INLINE bool fast_block(int64_t k, float s) const {
      return !V::fp8_block_has_nan(p + k) &&
             (__builtin_fabsf(s) < 0x1p120f || !__builtin_isfinite(s));
    }
    DF_ALWAYS_INLINE F load_fast(int64_t k, F s256) const {
      return V::mul(V::load_fp8_half(p + k), s256);
    }
    // Decoded (exact) weights of columns [k, k + L); k a multiple of L.
    DF_ALWAYS_INLINE F load(int64_t k) const {
      if constexpr (Fmt == WeightFormat::kF32) {
        return V::load(reinterpret_cast<const float*>(p) + k);
      } else if constexpr (Fmt == WeightFormat::kBF16) {
        return V::load_bf16(reinterpret_cast<const uint16_t*>(p) + k);
      } else if constexpr (kQuantized<Fmt>) {
        return load_scaled(k, group_vec(k));
      } else {
        return V::load_i8(reinterpret_cast<const int8_t*>(p) + k, sv);
      }
    }
    // Decoded (exact) weight of column k, computed like load() does per lane.
    DF_ALWAYS_INLINE float elem(int64_t k) const {
      if constexpr (Fmt == WeightFormat::kF32) {
        float v;
        std::memcpy(&v, p + k * 4, 4);
        return v;
      } else if constexpr (Fmt == WeightFormat::kBF16) {
        uint16_t h;
        std::memcpy(&h, p + k * 2, 2);
        return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      } else if constexpr (Fmt == WeightFormat::kFP8) {
        return kE4M3.v[p[k]] * block_scale(k);
      } else if constexpr (Fmt == WeightFormat::kInt4) {
        const int q = static_cast<int>((p[k / 2] >> (k % 2 * 4)) & 0xF) - 8;
        return static_cast<float>(q) * block_scale(k);
      } else {
        return static_cast<float>(static_cast<int8_t>(p[k])) * s;
      }
    }
    // Columns [k, k + len), len < L, zero-padded to a vector.
    F load_tail(int64_t k, int len) const {
      alignas(64) float t[L] = {};
      for (int i = 0; i < len; ++i) t[i] = elem(k + i);
      return V::load(t);
    }
    // Decodes columns [k0, k0 + len) into out[0, round_up(len, L)), zero-padded.
    void decode(int64_t k0, int64_t len, float* out) const {
      int64_t k = 0;
      if constexpr (Fmt == WeightFormat::kFP8) {  // whole blocks: one scale, the fast path
        if (k0 % kFp8Block == 0) {
          for (; k + kFp8Block <= len; k += kFp8Block) {
            const float sc = block_scale(k0 + k);
            if (fast_block(k0 + k, sc)) {
              const F s256 = V::set1(sc * 256.0f);
              for (int64_t u = 0; u < kFp8Block; u += L)
                V::store(out + k + u, load_fast(k0 + k + u, s256));
            } else {
              const F sv = V::set1(sc);
              for (int64_t u = 0; u < kFp8Block; u += L)
                V::store(out + k + u, load_scaled(k0 + k + u, sv));
            }
          }
        }
      }
      for (; k + L <= len; k += L) V::store(out + k, load(k0 + k));
      if (k < len) V::store(out + k, load_tail(k0 + k, static_cast<int>(len - k)));
    }
  };

  // ---- MXFP4 rows ------------------------------------------------------------------------------
  static const uint8_t* mx_row(const Matrix& w, int64_t n) {
    return static_cast<const uint8_t*>(w.data) + n * w.row_bytes();
  }
  static const uint8_t* mx_scales(const Matrix& w, int64_t n) {
    return w.scales + n * w.scale_row_bytes();
  }
  // Block b of a row (packed bytes q, scale bytes e, `groups` groups in the row): the doubled
  // codes c and the matching vector of half scales. Groups past the end of the row decode as
  // code 0 with scale 0 (x is zero there too), so they add exact zeros.
  DF_ALWAYS_INLINE static void mx_block(const uint8_t* q, const uint8_t* e, int64_t groups,
                                        int64_t b, F (&c)[kNV], F& s) {
    const int64_t g0 = b * kBG;
    if (g0 + kBG <= groups) {
      V::mx_decode(q + g0 * 16, c);
      s = V::mx_scales(e + g0);
    } else {
      float sc[kBG];
      alignas(64) uint8_t tmp[16 * kBG] = {};
      DF_UNROLL
      for (int g = 0; g < kBG; ++g) {
        sc[g] = 0.0f;
        if (g0 + g < groups) {
          std::memcpy(tmp + 16 * g, q + (g0 + g) * 16, 16);
          sc[g] = kHalfScale.v[e[g0 + g]];
        }
      }
      V::mx_decode(tmp, c);
      s = V::mx_scales_f(sc);
    }
  }
  static int64_t mx_padded(int64_t K) { return round_up(K, kBC); }
  // x row (K columns) -> the decoder's column order, zero-padded to mx_padded(K).
  static void pack_x_mx(const float* x, int64_t K, float* out) {
    for (int64_t b0 = 0; b0 < K; b0 += kBC) {
      DF_UNROLL
      for (int v = 0; v < kNV; ++v) {
        DF_UNROLL
        for (int l = 0; l < L; ++l) {
          const int64_t col = b0 + V::mx_column(v, l);
          out[b0 + v * L + l] = col < K ? x[col] : 0.0f;
        }
      }
    }
  }
  // Exact decoded weights of row n, columns [k0, k0 + len) (k0 a multiple of kBC), in column
  // order, into out[0, round_up(len, kBC)).
  static void mx_decode_exact(const Matrix& w, int64_t n, int64_t k0, int64_t len, float* out) {
    const uint8_t* q = mx_row(w, n);
    const uint8_t* e = mx_scales(w, n);
    const int64_t groups = w.cols / 32;
    for (int64_t b = k0 / kBC; b * kBC < k0 + len; ++b) {
      F c[kNV], s;
      mx_block(q, e, groups, b, c, s);
      alignas(64) float t[kBC];
      DF_UNROLL
      for (int v = 0; v < kNV; ++v) V::store(t + v * L, V::mul(c[v], s));
      float* o = out + (b * kBC - k0);
      DF_UNROLL
      for (int v = 0; v < kNV; ++v) DF_UNROLL
      for (int l = 0; l < L; ++l) o[V::mx_column(v, l)] = t[v * L + l];
    }
  }
  // The MXFP4 arithmetic of one block, shared by the small-M and the panel paths: two partial
  // sums (even and odd vectors; the first product of each a plain multiply), added, then
  // acc = fma(sum, scale, acc).
  DF_ALWAYS_INLINE static F mx_block_dot(const float* x, const F (&c)[kNV], F s, F acc) {
    F ga = V::mul(V::load(x), c[0]);
    F gb = V::mul(V::load(x + L), c[1]);
    DF_UNROLL
    for (int u = 2; u < kNV; u += 2) {
      ga = V::fma(V::load(x + u * L), c[u], ga);
      gb = V::fma(V::load(x + (u + 1) * L), c[u + 1], gb);
    }
    return V::fma(V::add(ga, gb), s, acc);
  }

  // y[m * ldy + r] = (accumulate ? y[m * ldy + r] : 0) + hsum(acc[m][r]): the end of every
  // product (GEMV rows and GEMM tiles alike, so both finish with the same additions).
  // Where the traits can sum four vectors at once (V::hsum4_store: the same additions as four
  // V::hsum, done side by side in one register), a row of four outputs ends in about half the
  // operations: this end ran once per output and was 7% of a BF16 GEMM's time.
  template <int M, int R>
  DF_ALWAYS_INLINE static void store_sums(const F (&acc)[M][R], float* y, int64_t ldy,
                                          bool accumulate) {
    DF_UNROLL
    for (int m = 0; m < M; ++m) {
      if constexpr (R == 4 && requires(F v, float* p) { V::hsum4_store(v, v, v, v, p, true); }) {
        V::hsum4_store(acc[m][0], acc[m][1], acc[m][2], acc[m][3], y + m * ldy, accumulate);
        continue;
      }
      DF_UNROLL
      for (int r = 0; r < R; ++r) {
        const float v = V::hsum(acc[m][r]);
        float& out = y[m * ldy + r];
        out = accumulate ? out + v : v;
      }
    }
  }

  // ---- small M: stream each weight row once -----------------------------------------------------
  template <WeightFormat Fmt, int M, int R>
  static void gemv_plain(const Matrix& w, int64_t n, const float* x, int64_t ldx, float* y,
                         int64_t ldy, bool accumulate) {
    const int64_t K = w.cols;
    Row<Fmt> row[R];
    DF_UNROLL
    for (int r = 0; r < R; ++r) row[r].init(w, n + r);
    F acc[M][R];
    DF_UNROLL
    for (int m = 0; m < M; ++m) DF_UNROLL
    for (int r = 0; r < R; ++r) acc[m][r] = V::zero();
    // Rows up to 16 KB: prefetch the next R rows at the pace these are consumed (see gemv_mx),
    // every line of them: a step that consumes several lines prefetches as many (one line per
    // step left the R rows' streams to the hardware, which kept one Zen 5 core at 60% of its
    // read bandwidth on K3's and Kimi-Linear's rows). Longer rows are long streams, which the
    // hardware prefetchers handle as well alone (K3's 24 KB rows: no difference measured).
    constexpr int kEsz = Fmt == WeightFormat::kF32 ? 4 : Fmt == WeightFormat::kBF16 ? 2 : 1;
    constexpr int kStep = L * kEsz * R;  // bytes of the R rows consumed per step
    const bool prefetch_rows = w.row_bytes() <= 16384;
    const uint8_t* pf = static_cast<const uint8_t*>(w.data) + (n + R) * w.row_bytes();
    int64_t k = 0;
    for (; k + L <= K; k += L) {
      if (prefetch_rows) {
        if constexpr (kStep <= 64) {
          if ((k * kEsz * R) % 64 < kStep) V::prefetch(pf + k * kEsz * R);
        } else {
          DF_UNROLL
          for (int b = 0; b < kStep; b += 64) V::prefetch(pf + k * kEsz * R + b);
        }
      }
      F wv[R];
      DF_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = row[r].load(k);
      DF_UNROLL
      for (int m = 0; m < M; ++m) {
        F xv = V::load(x + m * ldx + k);
        DF_UNROLL
        for (int r = 0; r < R; ++r) acc[m][r] = V::fma(xv, wv[r], acc[m][r]);
      }
    }
    if (k < K) {
      int rem = static_cast<int>(K - k);
      F wv[R];
      DF_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = row[r].load_tail(k, rem);
      DF_UNROLL
      for (int m = 0; m < M; ++m) {
        F xv = V::load_partial(x + m * ldx + k, rem);
        DF_UNROLL
        for (int r = 0; r < R; ++r) acc[m][r] = V::fma(xv, wv[r], acc[m][r]);
      }
    }
    store_sums<M, R>(acc, y + n, ldy, accumulate);
  }

  // x here is already in the decoder's column order (xp, row stride ldxp).
  template <int M, int R>
  static void gemv_mx(const Matrix& w, int64_t n, const float* xp, int64_t ldxp, float* y,
                      int64_t ldy, bool accumulate) {
    const int64_t groups = w.cols / 32;
    const int64_t blocks = (groups + kBG - 1) / kBG;
    const uint8_t* q[R];
    const uint8_t* e[R];
    DF_UNROLL
    for (int r = 0; r < R; ++r) {
      q[r] = mx_row(w, n + r);
      e[r] = mx_scales(w, n + r);
    }
    F acc[M][R];
    DF_UNROLL
    for (int m = 0; m < M; ++m) DF_UNROLL
    for (int r = 0; r < R; ++r) acc[m][r] = V::zero();
    // The R rows are one contiguous run of bytes, short (a few KB) and read as R interleaved
    // streams, which the hardware prefetchers pick up late; so each step prefetches the same
    // share of the next R rows (and their scales) as it consumes of these.
    const uint8_t* pf_q = mx_row(w, n + R);
    const uint8_t* pf_e = mx_scales(w, n + R);
    constexpr int kStepBytes = R * 16 * kBG;
    const int64_t full = groups / kBG;
    for (int64_t b = 0; b < full; ++b) {
      DF_UNROLL
      for (int o = 0; o < kStepBytes; o += 64) V::prefetch(pf_q + b * kStepBytes + o);
      V::prefetch(pf_e + b * R * kBG);
      DF_UNROLL
      for (int r = 0; r < R; ++r) {
        F c[kNV];
        V::mx_decode(q[r] + b * 16 * kBG, c);
        const F s = V::mx_scales(e[r] + b * kBG);
        DF_UNROLL
        for (int m = 0; m < M; ++m)
          acc[m][r] = mx_block_dot(xp + m * ldxp + b * kBC, c, s, acc[m][r]);
      }
    }
    if (full < blocks) {  // a last, partial block
      DF_UNROLL
      for (int r = 0; r < R; ++r) {
        F c[kNV], s;
        mx_block(q[r], e[r], groups, full, c, s);
        DF_UNROLL
        for (int m = 0; m < M; ++m)
          acc[m][r] = mx_block_dot(xp + m * ldxp + full * kBC, c, s, acc[m][r]);
      }
    }
    store_sums<M, R>(acc, y + n, ldy, accumulate);
  }

  // FP8 / INT4 for small M: gemv_plain's operations in its order (lane j of each output sums
  // x[k] * W(n, k) over k = j, j + L, ... ascending), with the weights decoded a block (FP8: 128
  // columns, one F32 scale) or group (INT4: 32 columns, one BF16 scale) at a time, so a scale is
  // read and broadcast once per block and row instead of once per vector. Per vector of weights:
  // the decoder, one multiply by the scale, M FMAs.
  template <WeightFormat Fmt, int M, int R>
  static void gemv_q(const Matrix& w, int64_t n, const float* x, int64_t ldx, float* y, int64_t ldy,
                     bool accumulate) {
    constexpr int64_t B = Fmt == WeightFormat::kFP8 ? kFp8Block : kInt4Group;
    static_assert(B % L == 0);
    const int64_t K = w.cols;
    Row<Fmt> row[R];
    DF_UNROLL
    for (int r = 0; r < R; ++r) row[r].init(w, n + r);
    F acc[M][R];
    DF_UNROLL
    for (int m = 0; m < M; ++m) DF_UNROLL
    for (int r = 0; r < R; ++r) acc[m][r] = V::zero();
    // Short rows (INT4 experts: 1-4 KB): prefetch the next R rows at the pace these are consumed,
    // as gemv_plain does; long rows are streams the hardware prefetchers follow.
    constexpr int64_t kBlockBytes = Fmt == WeightFormat::kFP8 ? B : B / 2;
    const bool short_rows = w.row_bytes() <= 4096;
    const uint8_t* pf = static_cast<const uint8_t*>(w.data) + (n + R) * w.row_bytes();
    const int64_t blocks = K / B;
    constexpr int64_t kScaleRun = 16;
    alignas(64) float run[R][kScaleRun];  // INT4: the scales of groups b - b % 16 ... on
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * B;
      if (short_rows) {
        DF_UNROLL
        for (int64_t o = 0; o < R * kBlockBytes; o += 64) V::prefetch(pf + b * R * kBlockBytes + o);
      }
      // FMAs of the block's vectors, the weights from `decode(r, k)`
      auto block = [&](auto decode) DF_ALWAYS_INLINE_LAMBDA {
        for (int64_t u = 0; u < B; u += L) {
          F wv[R];
          DF_UNROLL
          for (int r = 0; r < R; ++r) wv[r] = decode(r, k0 + u);
          DF_UNROLL
          for (int m = 0; m < M; ++m) {
            const F xv = V::load(x + m * ldx + k0 + u);
            DF_UNROLL
            for (int r = 0; r < R; ++r) acc[m][r] = V::fma(xv, wv[r], acc[m][r]);
          }
        }
      };
      F g[R];
      if constexpr (Fmt == WeightFormat::kFP8) {
        float sc[R];
        bool fast = true;
        DF_UNROLL
        for (int r = 0; r < R; ++r) {
          sc[r] = row[r].block_scale(k0);
          fast = row[r].fast_block(k0, sc[r]) && fast;
        }
        if (fast) {
          DF_UNROLL
          for (int r = 0; r < R; ++r) g[r] = V::set1(sc[r] * 256.0f);
          block([&](int r, int64_t k)
                    DF_ALWAYS_INLINE_LAMBDA { return row[r].load_fast(k, g[r]); });
          continue;
        }
      }
      if constexpr (Fmt == WeightFormat::kInt4) {
        // The rows' BF16 scales, widened 16 groups (512 columns) at a time into `run` (a loop
        // the compiler vectorises), so a group costs one multiply by a scale from memory
        // (V::int4_group) instead of a scalar load, shift and broadcast.
        const int64_t j = b % kScaleRun;
        if (j == 0) {
          DF_UNROLL
          for (int r = 0; r < R; ++r)
            widen_bf16(row[r].sp + b * 2, imin(kScaleRun, blocks - b), run[r]);
        }
        DF_UNROLL
        for (int r = 0; r < R; ++r) g[r] = V::int4_group(run[r][j]);
      } else {
        DF_UNROLL
        for (int r = 0; r < R; ++r) g[r] = row[r].group_vec(k0);
      }
      block([&](int r, int64_t k) DF_ALWAYS_INLINE_LAMBDA { return row[r].load_scaled(k, g[r]); });
    }
    int64_t k = blocks * B;
    for (; k + L <= K; k += L) {  // the whole vectors of a last, partial block
      F wv[R];
      DF_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = row[r].load(k);
      DF_UNROLL
      for (int m = 0; m < M; ++m) {
        const F xv = V::load(x + m * ldx + k);
        DF_UNROLL
        for (int r = 0; r < R; ++r) acc[m][r] = V::fma(xv, wv[r], acc[m][r]);
      }
    }
    if (k < K) {
      const int rem = static_cast<int>(K - k);
      F wv[R];
      DF_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = row[r].load_tail(k, rem);
      DF_UNROLL
      for (int m = 0; m < M; ++m) {
        const F xv = V::load_partial(x + m * ldx + k, rem);
        DF_UNROLL
        for (int r = 0; r < R; ++r) acc[m][r] = V::fma(xv, wv[r], acc[m][r]);
      }
    }
    store_sums<M, R>(acc, y + n, ldy, accumulate);
  }

  // n (<= 16) BF16 values at p (any alignment) as floats; the full run as one fixed-length loop.
  DF_ALWAYS_INLINE static void widen_bf16(const uint8_t* p, int64_t n, float* out) {
    if (n == 16) {
      uint16_t h[16];
      std::memcpy(h, p, sizeof h);
      DF_UNROLL
      for (int i = 0; i < 16; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(h[i]) << 16);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
    }
  }

  // Rows [n0, n1) for a fixed small M, R rows at a time (fewer at the end).
  template <WeightFormat Fmt, int M>
  static void gemv(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t ldx, float* y,
                   int64_t ldy, bool accumulate) {
    if constexpr (Fmt == WeightFormat::kMXFP4 && kPermuted) {
      const int64_t kp = mx_padded(w.cols);
      float* xp = t_xpack.floats(M * kp);
      DF_UNROLL
      for (int m = 0; m < M; ++m) pack_x_mx(x + m * ldx, w.cols, xp + m * kp);
      x = xp;
      ldx = kp;
    }
    gemv_rows<Fmt, M>(w, n0, n1, x, ldx, y, ldy, accumulate);
  }

  // MXFP4 for M up to V::kMxGemvMaxM rows: the GEMV (decode in registers) over groups of four
  // activation rows, a band of weight rows at a time so that the band is still in L2 for the
  // next group. Between 5 and 16 rows this beats the panel GEMM, whose decoded panel is
  // amortised over too few rows (3072x3584 on one Zen 3 core: M = 8 at 34% and M = 16 at 45% of
  // the FMA peak in the GEMM, 54% for M = 4 in the GEMV). Each row's result is the GEMV's, which
  // the GEMM reproduces bit for bit, so the choice does not change any output.
  static void gemv_mx_groups(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M,
                             int64_t ldx, float* y, int64_t ldy, bool accumulate) {
    constexpr int64_t kBand = 32;
    int64_t ldp = ldx;
    if constexpr (kPermuted) {
      ldp = mx_padded(w.cols);
      float* xp = t_xpack.floats(M * ldp);
      for (int64_t m = 0; m < M; ++m) pack_x_mx(x + m * ldx, w.cols, xp + m * ldp);
      x = xp;
    }
    for (int64_t nb = n0; nb < n1; nb += kBand) {
      const int64_t ne = imin(n1, nb + kBand);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = x + m0 * ldp;
        float* ym = y + m0 * ldy;
        with_tile<4, 1>(static_cast<int>(imin(4, M - m0)), 1, [&](auto mm, auto) {
          gemv_rows<WeightFormat::kMXFP4, decltype(mm)::value>(w, nb, ne, xm, ldp, ym, ldy,
                                                               accumulate);
        });
      }
    }
  }

  // FP8 / INT4 for M up to V::kQuantGemvMaxM rows: as gemv_mx_groups, the GEMV over groups of
  // four activation rows, a band of weight rows at a time (still in L2 for the next group).
  // Between 5 and 16 rows this beats the panel GEMM, which decodes a panel for too few rows
  // (K2 expert 2048x7168 on one Zen 5 core, INT4 at M = 8: the GEMM took twice as long as two
  // four-row GEMVs); each row's result is the GEMV's, which the GEMM reproduces bit for bit.
  template <WeightFormat Fmt>
  static void gemv_q_groups(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M,
                            int64_t ldx, float* y, int64_t ldy, bool accumulate) {
    constexpr int64_t kBand = 32;
    for (int64_t nb = n0; nb < n1; nb += kBand) {
      const int64_t ne = imin(n1, nb + kBand);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        with_tile<4, 1>(static_cast<int>(imin(4, M - m0)), 1, [&](auto mm, auto) {
          gemv_rows<Fmt, decltype(mm)::value>(w, nb, ne, x + m0 * ldx, ldx, y + m0 * ldy, ldy,
                                              accumulate);
        });
      }
    }
  }

  // Weight rows per step of the plain formats' GEMV (f32, bf16, int8): the traits' own where
  // they set one (V::gemv_rows_plain), else the same as the quantised formats'. How many rows
  // run side by side changes no output's additions, only how many streams are in flight.
  template <int M>
  static constexpr int plain_rows() {
    if constexpr (requires { V::gemv_rows_plain(M); }) {
      return V::gemv_rows_plain(M);
    } else {
      return V::gemv_rows(M);
    }
  }

  // gemv's row loop over x already in the layout the format needs (see gemv).
  template <WeightFormat Fmt, int M>
  static void gemv_rows(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t ldx,
                        float* y, int64_t ldy, bool accumulate) {
    constexpr bool kMx = Fmt == WeightFormat::kMXFP4;
    constexpr int R = kMx               ? V::gemv_rows_mx(M)
                      : kQuantized<Fmt> ? V::gemv_rows(M)
                                        : plain_rows<M>();
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
      if constexpr (kMx) {
        gemv_mx<M, R>(w, n, x, ldx, y, ldy, accumulate);
      } else if constexpr (kQuantized<Fmt>) {
        gemv_q<Fmt, M, R>(w, n, x, ldx, y, ldy, accumulate);
      } else {
        gemv_plain<Fmt, M, R>(w, n, x, ldx, y, ldy, accumulate);
      }
    }
    if (n < n1) {
      with_tile<1, R>(1, static_cast<int>(n1 - n), [&](auto, auto rr) {
        constexpr int RT = decltype(rr)::value;
        if constexpr (kMx) {
          gemv_mx<M, RT>(w, n, x, ldx, y, ldy, accumulate);
        } else if constexpr (kQuantized<Fmt>) {
          gemv_q<Fmt, M, RT>(w, n, x, ldx, y, ldy, accumulate);
        } else {
          gemv_plain<Fmt, M, RT>(w, n, x, ldx, y, ldy, accumulate);
        }
      });
    }
  }

  // ---- large M: decoded panel + register-blocked micro-kernel -----------------------------------
  // One micro-tile: MR activation rows x NR panel rows over one K block of `kb` columns.
  struct Tile {
    const float* x;  // x + m * ldx + kb0
    int64_t ldx;
    const float* p;  // panel row j (decoded weights, or doubled MXFP4 codes)
    int64_t ldp;     // panel row stride (floats)
    const float* s;  // MXFP4: panel scales of row j (per group of this block)
    int64_t lds;
    const uint8_t* w;  // direct formats (f32, bf16): W row j at column kb0, not decoded
    int64_t ldw;       // bytes between W rows
    int64_t kb;        // valid columns in this block
    F* acc;            // carried accumulators of (m, j), row stride kNB vectors
    bool first, last;
    float* y;  // y + m * ldy + n
    int64_t ldy;
    bool accumulate;
  };

  // Both inline into the tile: called out of line, the 24 accumulators went through the stack.
  template <int MR, int NR>
  DF_ALWAYS_INLINE static void finish_tile(const Tile& t, F (&acc)[MR][NR]) {
    if (t.last) {
      store_sums<MR, NR>(acc, t.y, t.ldy, t.accumulate);
    } else {
      DF_UNROLL
      for (int i = 0; i < MR; ++i) DF_UNROLL
      for (int r = 0; r < NR; ++r)
        V::store(reinterpret_cast<float*>(t.acc + i * kNB + r), acc[i][r]);
    }
  }

  template <int MR, int NR>
  DF_ALWAYS_INLINE static void start_tile(const Tile& t, F (&acc)[MR][NR]) {
    DF_UNROLL
    for (int i = 0; i < MR; ++i) {
      DF_UNROLL
      for (int r = 0; r < NR; ++r) {
        acc[i][r] =
            t.first ? V::zero() : V::load(reinterpret_cast<const float*>(t.acc + i * kNB + r));
      }
    }
  }

  // Where a plain tile's weights come from: the decoded panel (int8; zero-padded, so the last
  // partial vector is a plain load), or, for f32 and bf16, W itself, widened in registers (a
  // shift for bf16) like the GEMV does. Reading W in place gives the same products in the same
  // order without writing and re-reading a panel, whose short far-apart row segments stalled on
  // every line (18% of a BF16 GEMM at M = 64).
  struct PanelRows {
    const float* p;
    int64_t ldp;
    DF_ALWAYS_INLINE F load(int r, int64_t k) const { return V::load(p + r * ldp + k); }
    DF_ALWAYS_INLINE F load_tail(int r, int64_t k, int) const { return load(r, k); }
  };
  template <WeightFormat Fmt, int NR>
  struct DirectRows {
    Row<Fmt> row[NR];
    DF_ALWAYS_INLINE F load(int r, int64_t k) const { return row[r].load(k); }
    F load_tail(int r, int64_t k, int rem) const { return row[r].load_tail(k, rem); }
  };

  template <int MR, int NR, class Src>
  static void micro_plain(const Tile& t, const Src& src) {
    F acc[MR][NR];
    start_tile<MR, NR>(t, acc);
    int64_t k = 0;
    for (; k + L <= t.kb; k += L) {
      F wv[NR];
      DF_UNROLL
      for (int r = 0; r < NR; ++r) wv[r] = src.load(r, k);
      DF_UNROLL
      for (int i = 0; i < MR; ++i) {
        F xv = V::load(t.x + i * t.ldx + k);
        V::in_register(xv);
        DF_UNROLL
        for (int r = 0; r < NR; ++r) acc[i][r] = V::fma(xv, wv[r], acc[i][r]);
      }
    }
    if (k < t.kb) {
      const int rem = static_cast<int>(t.kb - k);
      F wv[NR];
      DF_UNROLL
      for (int r = 0; r < NR; ++r) wv[r] = src.load_tail(r, k, rem);
      DF_UNROLL
      for (int i = 0; i < MR; ++i) {
        F xv = V::load_partial(t.x + i * t.ldx + k, rem);
        DF_UNROLL
        for (int r = 0; r < NR; ++r) acc[i][r] = V::fma(xv, wv[r], acc[i][r]);
      }
    }
    finish_tile<MR, NR>(t, acc);
  }

  // MXFP4 tile: per block, the even-vector half sums of all MR x NR outputs first (kept in L1),
  // then the odd ones, then acc = fma(even + odd, s, acc) with acc also kept in L1. Only one set
  // of half sums is live in registers, so the tile can be as tall as the plain one (the AVX2
  // 2 x 2 tile with both half sums and acc in registers was load-bound: one load per FMA).
  template <int MR, int NR>
  static void micro_mx(const Tile& t) {
    alignas(64) float accm[MR][NR][L];
    alignas(64) float even[MR][NR][L];
    DF_UNROLL
    for (int i = 0; i < MR; ++i) DF_UNROLL
    for (int r = 0; r < NR; ++r)
      V::store(accm[i][r],
               t.first ? V::zero() : V::load(reinterpret_cast<const float*>(t.acc + i * kNB + r)));
    for (int64_t b = 0; b * kBC < t.kb; ++b) {
      const int64_t k = b * kBC;
      DF_UNROLL
      for (int h = 0; h < 2; ++h) {  // h = 0: even vectors, 1: odd vectors
        F g[MR][NR];
        {
          F w[NR];
          DF_UNROLL
          for (int r = 0; r < NR; ++r) w[r] = V::load(t.p + r * t.ldp + k + h * L);
          DF_UNROLL
          for (int i = 0; i < MR; ++i) {
            F xv = V::load(t.x + i * t.ldx + k + h * L);
            V::in_register(xv);
            DF_UNROLL
            for (int r = 0; r < NR; ++r) g[i][r] = V::mul(xv, w[r]);
          }
        }
        DF_UNROLL
        for (int u = 2 + h; u < kNV; u += 2) {
          F w[NR];
          DF_UNROLL
          for (int r = 0; r < NR; ++r) w[r] = V::load(t.p + r * t.ldp + k + u * L);
          DF_UNROLL
          for (int i = 0; i < MR; ++i) {
            F xv = V::load(t.x + i * t.ldx + k + u * L);
            V::in_register(xv);
            DF_UNROLL
            for (int r = 0; r < NR; ++r) g[i][r] = V::fma(xv, w[r], g[i][r]);
          }
        }
        if (h == 0) {
          DF_UNROLL
          for (int i = 0; i < MR; ++i) DF_UNROLL
          for (int r = 0; r < NR; ++r) V::store(even[i][r], g[i][r]);
        } else {
          DF_UNROLL
          for (int r = 0; r < NR; ++r) {
            const F s = V::load(t.s + (r * t.lds + b) * L);
            DF_UNROLL
            for (int i = 0; i < MR; ++i)
              V::store(accm[i][r],
                       V::fma(V::add(V::load(even[i][r]), g[i][r]), s, V::load(accm[i][r])));
          }
        }
      }
    }
    F acc[MR][NR];
    DF_UNROLL
    for (int i = 0; i < MR; ++i) DF_UNROLL
    for (int r = 0; r < NR; ++r) acc[i][r] = V::load(accm[i][r]);
    finish_tile<MR, NR>(t, acc);
  }

  // MXFP4 tile with both half sums and the accumulators in registers (3 MR NR vectors), where the
  // traits have the registers for it (V::kMxInRegisters: AVX-512's 4x2). The same operations in
  // the same order as micro_mx and gemv_mx, so the same bits; no half sum goes through L1.
  template <int MR, int NR>
  static void micro_mx_regs(const Tile& t) {
    F acc[MR][NR];
    start_tile<MR, NR>(t, acc);
    for (int64_t b = 0; b * kBC < t.kb; ++b) {
      const int64_t k = b * kBC;
      F ga[MR][NR], gb[MR][NR];
      DF_UNROLL
      for (int u = 0; u < kNV; u += 2) {
        F w[NR];
        DF_UNROLL
        for (int r = 0; r < NR; ++r) w[r] = V::load(t.p + r * t.ldp + k + u * L);
        DF_UNROLL
        for (int i = 0; i < MR; ++i) {
          F xv = V::load(t.x + i * t.ldx + k + u * L);
          V::in_register(xv);
          DF_UNROLL
          for (int r = 0; r < NR; ++r)
            ga[i][r] = u == 0 ? V::mul(xv, w[r]) : V::fma(xv, w[r], ga[i][r]);
        }
        DF_UNROLL
        for (int r = 0; r < NR; ++r) w[r] = V::load(t.p + r * t.ldp + k + (u + 1) * L);
        DF_UNROLL
        for (int i = 0; i < MR; ++i) {
          F xv = V::load(t.x + i * t.ldx + k + (u + 1) * L);
          V::in_register(xv);
          DF_UNROLL
          for (int r = 0; r < NR; ++r)
            gb[i][r] = u == 0 ? V::mul(xv, w[r]) : V::fma(xv, w[r], gb[i][r]);
        }
      }
      DF_UNROLL
      for (int r = 0; r < NR; ++r) {
        const F s = V::load(t.s + (r * t.lds + b) * L);
        DF_UNROLL
        for (int i = 0; i < MR; ++i) acc[i][r] = V::fma(V::add(ga[i][r], gb[i][r]), s, acc[i][r]);
      }
    }
    finish_tile<MR, NR>(t, acc);
  }

  template <WeightFormat Fmt>
  static void gemm(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M, int64_t ldx,
                   float* y, int64_t ldy, bool accumulate) {
    constexpr bool kMx = Fmt == WeightFormat::kMXFP4;
    constexpr bool kDirect = Fmt == WeightFormat::kF32 || Fmt == WeightFormat::kBF16;
    constexpr int MR = kMx ? V::kMxMR : V::kMR;
    constexpr int NR = kMx ? V::kMxNR : V::kNR;
    static_assert(kMB % MR == 0 && kNB % NR == 0);
    const int64_t K = w.cols;
    // Panel row stride: a whole K block, or all of K (rounded to vectors / MXFP4 blocks).
    const int64_t ldp = imin(kKB, kMx ? mx_padded(K) : round_up(K, L));
    const int64_t lds = ldp / kBC;  // MXFP4: scale vectors per panel row
    float* panel = kDirect ? nullptr : t_panel.floats(kNB * ldp);
    float* scales = kMx ? t_scales.floats(kNB * lds * L) : nullptr;
    // x is packed per block of rows: contiguous rows (in the MXFP4 decoder's column order where
    // that is permuted), zero-padded, with a row stride that is not a multiple of 4 KiB, so the
    // MR rows of a tile do not all fall into the same L1 sets (K = 7168 floats is 7 x 4 KiB).
    const int64_t kp = (kMx ? mx_padded(K) : round_up(K, L)) + 16;
    // Rows per block: every block streams all of W (from DRAM for the trunk's large matrices),
    // so a block is as tall as kXPackBytes of packed x allows (at least kMB rows): a 256-row
    // prefill pass over a 7168-column matrix reads W once instead of three times.
    constexpr int64_t kXPackBytes = int64_t{8} << 20;
    const int64_t fit = kXPackBytes / (kp * 4) / MR * MR;
    const int64_t mbr = M <= (fit > kMB ? fit : kMB) ? M : (fit > kMB ? fit : kMB);
    F* accbuf = K > kKB ? reinterpret_cast<F*>(t_acc.floats(mbr * kNB * L)) : nullptr;
    float* xpack = t_xpack.floats(mbr * kp);
    const int64_t groups = K / 32;
    Tile t{};
    t.ldx = kp;
    t.ldy = ldy;
    t.accumulate = accumulate;
    t.ldp = ldp;
    t.lds = lds;
    t.ldw = w.row_bytes();
    for (int64_t mb0 = 0; mb0 < M; mb0 += mbr) {
      const int mb = static_cast<int>(imin(mbr, M - mb0));
      for (int m = 0; m < mb; ++m) {
        const float* src = x + (mb0 + m) * ldx;
        float* dst = xpack + m * kp;
        if constexpr (kMx && kPermuted) {
          pack_x_mx(src, K, dst);
        } else {
          std::memcpy(dst, src, static_cast<size_t>(K) * sizeof(float));
          for (int64_t k = K; k < kp - 16; ++k) dst[k] = 0.0f;
        }
      }
      const float* xb = xpack;
      for (int64_t nb0 = n0; nb0 < n1; nb0 += kNB) {
        const int nb = static_cast<int>(imin(kNB, n1 - nb0));
        for (int64_t kb0 = 0; kb0 < K; kb0 += kKB) {
          const int64_t kb = imin(kKB, K - kb0);
          for (int i = 0; i < nb; ++i) {
            if constexpr (kMx) {
              const uint8_t* q = mx_row(w, nb0 + i);
              const uint8_t* e = mx_scales(w, nb0 + i);
              for (int64_t b = 0; b * kBC < kb; ++b) {
                F c[kNV], s;
                mx_block(q, e, groups, kb0 / kBC + b, c, s);
                DF_UNROLL
                for (int u = 0; u < kNV; ++u) V::store(panel + i * ldp + b * kBC + u * L, c[u]);
                V::store(scales + (i * lds + b) * L, s);
              }
            } else if constexpr (!kDirect) {
              Row<Fmt> row;
              row.init(w, nb0 + i);
              row.decode(kb0, kb, panel + i * ldp);
            }
          }
          t.kb = kb;
          t.first = kb0 == 0;
          t.last = kb0 + kb >= K;
          for (int m = 0; m < mb; m += MR) {
            const int mr = static_cast<int>(imin(MR, mb - m));
            for (int j = 0; j < nb; j += NR) {
              const int nr = static_cast<int>(imin(NR, nb - j));
              t.x = xb + m * t.ldx + kb0;
              t.p = kDirect ? nullptr : panel + j * ldp;  // direct tiles have no panel
              t.s = kMx ? scales + j * lds * L : nullptr;
              t.acc = accbuf != nullptr ? accbuf + m * kNB + j : nullptr;
              if constexpr (kDirect) {
                t.w = static_cast<const uint8_t*>(w.data) + (nb0 + j) * t.ldw +
                      kb0 * (Fmt == WeightFormat::kF32 ? 4 : 2);
              }
              t.y = y + (mb0 + m) * ldy + nb0 + j;
              with_tile<MR, NR>(mr, nr, [&](auto mm, auto nn) {
                if constexpr (kMx && V::kMxInRegisters) {
                  micro_mx_regs<decltype(mm)::value, decltype(nn)::value>(t);
                } else if constexpr (kMx) {
                  micro_mx<decltype(mm)::value, decltype(nn)::value>(t);
                } else if constexpr (kDirect) {
                  DirectRows<Fmt, decltype(nn)::value> src;
                  DF_UNROLL
                  for (int r = 0; r < decltype(nn)::value; ++r) src.row[r].p = t.w + r * t.ldw;
                  micro_plain<decltype(mm)::value, decltype(nn)::value>(t, src);
                } else {
                  micro_plain<decltype(mm)::value, decltype(nn)::value>(t, PanelRows{t.p, t.ldp});
                }
              });
            }
          }
        }
      }
    }
  }

  template <WeightFormat Fmt>
  static void matmul(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M,
                     int64_t ldx, float* y, int64_t ldy, bool accumulate) {
    if (n0 >= n1 || M <= 0) return;
    switch (M) {
      case 1:
        return gemv<Fmt, 1>(w, n0, n1, x, ldx, y, ldy, accumulate);
      case 2:
        return gemv<Fmt, 2>(w, n0, n1, x, ldx, y, ldy, accumulate);
      case 3:
        return gemv<Fmt, 3>(w, n0, n1, x, ldx, y, ldy, accumulate);
      case 4:
        return gemv<Fmt, 4>(w, n0, n1, x, ldx, y, ldy, accumulate);
      default:
        if constexpr (Fmt == WeightFormat::kMXFP4) {
          if (M <= V::kMxGemvMaxM) return gemv_mx_groups(w, n0, n1, x, M, ldx, y, ldy, accumulate);
        }
        if constexpr (kQuantized<Fmt>) {
          if (M <= V::kQuantGemvMaxM)
            return gemv_q_groups<Fmt>(w, n0, n1, x, M, ldx, y, ldy, accumulate);
        }
        return gemm<Fmt>(w, n0, n1, x, M, ldx, y, ldy, accumulate);
    }
  }

  // ---- matmul_t: y[m, c] += sum_r x[m, r] * W(r, c) ---------------------------------------------
  static constexpr int kTV = V::kTV;    // vectors of columns per tile
  static constexpr int kTM = V::kTM;    // activation rows per tile
  static constexpr int kTW = kTV * L;   // columns per tile
  static constexpr int64_t kTRB = 256;  // W rows per panel

  template <int MR>
  static void tile_t(const float* x, int64_t ldx, const float* p, int64_t rb, float* y, int64_t ldy,
                     int cw) {
    F acc[MR][kTV];
    const bool full = cw == kTW;
    DF_UNROLL
    for (int i = 0; i < MR; ++i) {
      DF_UNROLL
      for (int v = 0; v < kTV; ++v) {
        int len = static_cast<int>(imin(L, cw - v * L));
        acc[i][v] = full || len == L ? V::load(y + i * ldy + v * L)
                    : len > 0        ? V::load_partial(y + i * ldy + v * L, len)
                                     : V::zero();
      }
    }
    for (int64_t r = 0; r < rb; ++r) {
      F wv[kTV];
      DF_UNROLL
      for (int v = 0; v < kTV; ++v) wv[v] = V::load(p + r * kTW + v * L);
      DF_UNROLL
      for (int i = 0; i < MR; ++i) {
        F xb = V::bcast(x + i * ldx + r);
        DF_UNROLL
        for (int v = 0; v < kTV; ++v) acc[i][v] = V::fma(xb, wv[v], acc[i][v]);
      }
    }
    DF_UNROLL
    for (int i = 0; i < MR; ++i) {
      DF_UNROLL
      for (int v = 0; v < kTV; ++v) {
        int len = static_cast<int>(imin(L, cw - v * L));
        if (full || len == L) {
          V::store(y + i * ldy + v * L, acc[i][v]);
        } else if (len > 0) {
          V::store_partial(y + i * ldy + v * L, acc[i][v], len);
        }
      }
    }
  }

  // Small M: stream W row by row (contiguous segments) and update y in place, which stays in L1
  // for a chunk of kTC columns. The same FMAs, in the same order, as tile_t.
  static constexpr int64_t kTC = 512;
  template <WeightFormat Fmt, int M>
  static void matmul_t_rows(const Matrix& w, int64_t c0, int64_t c1, const float* x, int64_t ldx,
                            float* y, int64_t ldy) {
    for (int64_t cb0 = c0; cb0 < c1; cb0 += kTC) {
      const int64_t cw = imin(kTC, c1 - cb0);
      for (int64_t r = 0; r < w.rows; ++r) {
        Row<Fmt> row;
        row.init(w, r);
        F xb[M];
        DF_UNROLL
        for (int m = 0; m < M; ++m) xb[m] = V::bcast(x + m * ldx + r);
        int64_t c = 0;
        for (; c + L <= cw; c += L) {
          const F wv = row.load(cb0 + c);
          DF_UNROLL
          for (int m = 0; m < M; ++m) {
            float* yp = y + m * ldy + cb0 + c;
            V::store(yp, V::fma(xb[m], wv, V::load(yp)));
          }
        }
        if (c < cw) {
          const int rem = static_cast<int>(cw - c);
          const F wv = row.load_tail(cb0 + c, rem);
          DF_UNROLL
          for (int m = 0; m < M; ++m) {
            float* yp = y + m * ldy + cb0 + c;
            V::store_partial(yp, V::fma(xb[m], wv, V::load_partial(yp, rem)), rem);
          }
        }
      }
    }
  }

  template <WeightFormat Fmt>
  static void matmul_t(const Matrix& w, int64_t c0, int64_t c1, const float* x, int64_t M,
                       int64_t ldx, float* y, int64_t ldy) {
    if (c0 >= c1 || M <= 0) return;
    // MXFP4, FP8 and INT4 decode whole blocks / aligned vectors, so they go through the panel,
    // whose rows are decoded from an aligned column and then cut to the window.
    if constexpr (Fmt != WeightFormat::kMXFP4 && !kQuantized<Fmt>) {
      switch (M) {
        case 1:
          return matmul_t_rows<Fmt, 1>(w, c0, c1, x, ldx, y, ldy);
        case 2:
          return matmul_t_rows<Fmt, 2>(w, c0, c1, x, ldx, y, ldy);
        case 3:
          return matmul_t_rows<Fmt, 3>(w, c0, c1, x, ldx, y, ldy);
        case 4:
          return matmul_t_rows<Fmt, 4>(w, c0, c1, x, ldx, y, ldy);
        default:
          break;
      }
    }
    const int64_t R = w.rows;
    float* panel = t_panel.floats(kTRB * kTW);
    alignas(64) float row_buf[round_up(kTW, kBC) + kBC];
    for (int64_t cb0 = c0; cb0 < c1; cb0 += kTW) {
      const int cw = static_cast<int>(imin(kTW, c1 - cb0));
      for (int64_t rb0 = 0; rb0 < R; rb0 += kTRB) {
        const int64_t rb = imin(kTRB, R - rb0);
        for (int64_t r = 0; r < rb; ++r) {
          float* dst = panel + r * kTW;
          if constexpr (Fmt == WeightFormat::kMXFP4) {
            // Decode the blocks that cover [cb0, cb0 + cw), then copy the window.
            const int64_t g0 = cb0 / kBC * kBC;
            mx_decode_exact(w, rb0 + r, g0, cb0 + cw - g0, row_buf);
            for (int c = 0; c < kTW; ++c) dst[c] = c < cw ? row_buf[cb0 - g0 + c] : 0.0f;
          } else if constexpr (kQuantized<Fmt>) {
            Row<Fmt> row;
            row.init(w, rb0 + r);
            const int64_t a0 = cb0 / L * L;
            row.decode(a0, cb0 + cw - a0, row_buf);
            for (int c = 0; c < kTW; ++c) dst[c] = c < cw ? row_buf[cb0 - a0 + c] : 0.0f;
          } else {
            Row<Fmt> row;
            row.init(w, rb0 + r);
            row.decode(cb0, cw, dst);
            for (int c = static_cast<int>(round_up(cw, L)); c < kTW; ++c) dst[c] = 0.0f;
          }
        }
        for (int64_t m = 0; m < M; m += kTM) {
          const int mr = static_cast<int>(imin(kTM, M - m));
          with_tile<kTM, 1>(mr, 1, [&](auto mm, auto) {
            tile_t<decltype(mm)::value>(x + m * ldx + rb0, ldx, panel, rb, y + m * ldy + cb0, ldy,
                                        cw);
          });
        }
      }
    }
  }

  // ---- vectors ---------------------------------------------------------------------------------
  static float dot(const float* a, const float* b, int64_t n) {
    F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
    int64_t i = 0;
    for (; i + 4 * L <= n; i += 4 * L) {
      a0 = V::fma(V::load(a + i), V::load(b + i), a0);
      a1 = V::fma(V::load(a + i + L), V::load(b + i + L), a1);
      a2 = V::fma(V::load(a + i + 2 * L), V::load(b + i + 2 * L), a2);
      a3 = V::fma(V::load(a + i + 3 * L), V::load(b + i + 3 * L), a3);
    }
    for (; i + L <= n; i += L) a0 = V::fma(V::load(a + i), V::load(b + i), a0);
    if (i < n) {
      int rem = static_cast<int>(n - i);
      a0 = V::fma(V::load_partial(a + i, rem), V::load_partial(b + i, rem), a0);
    }
    return V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
  }

  static void axpy(float a, const float* x, float* y, int64_t n) {
    F av = V::set1(a);
    int64_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
      V::store(y + i, V::fma(av, V::load(x + i), V::load(y + i)));
      V::store(y + i + L, V::fma(av, V::load(x + i + L), V::load(y + i + L)));
    }
    for (; i + L <= n; i += L) V::store(y + i, V::fma(av, V::load(x + i), V::load(y + i)));
    if (i < n) {
      int rem = static_cast<int>(n - i);
      V::store_partial(y + i, V::fma(av, V::load_partial(x + i, rem), V::load_partial(y + i, rem)),
                       rem);
    }
  }

  // ---- element-wise functions ----------------------------------------------------------------
  // A tail shorter than a vector goes through the same vector function, from a zero-padded
  // load, so every value meets the same code wherever it sits.
  template <F (*Fn)(F)>
  static void map(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + L <= n; i += L) V::store(y + i, Fn(V::load(x + i)));
    if (i < n) {
      const int rem = static_cast<int>(n - i);
      V::store_partial(y + i, Fn(V::load_partial(x + i, rem)), rem);
    }
  }

  // ---- the FMA peak ----------------------------------------------------------------------------
  // kPeakChains independent accumulator chains (enough to cover the FMA latency times the FMA
  // ports of current x86 and ARM cores), no memory operands: what the core can do at best, the
  // yardstick GEMM efficiency is stated against. Returns a value that depends on every chain.
  // The chains are named locals, not an array: GCC kept an array of accumulators on the stack
  // (a load, FMA and store per step, bound by store forwarding), which measured a quarter of
  // the real peak and made GEMM look faster than the FMA units.
  static float fma_loop(int64_t iters) {
    static_assert(kPeakChains == 12);
    const F m = V::set1(0.9999999f), c = V::set1(1e-7f);
    F a0 = V::set1(1), a1 = V::set1(2), a2 = V::set1(3), a3 = V::set1(4), a4 = V::set1(5),
      a5 = V::set1(6), a6 = V::set1(7), a7 = V::set1(8), a8 = V::set1(9), a9 = V::set1(10),
      a10 = V::set1(11), a11 = V::set1(12);
    for (int64_t i = 0; i < iters; ++i) {
      a0 = V::fma(a0, m, c);
      a1 = V::fma(a1, m, c);
      a2 = V::fma(a2, m, c);
      a3 = V::fma(a3, m, c);
      a4 = V::fma(a4, m, c);
      a5 = V::fma(a5, m, c);
      a6 = V::fma(a6, m, c);
      a7 = V::fma(a7, m, c);
      a8 = V::fma(a8, m, c);
      a9 = V::fma(a9, m, c);
      a10 = V::fma(a10, m, c);
      a11 = V::fma(a11, m, c);
    }
    const F s0 = V::add(V::add(V::add(a0, a1), V::add(a2, a3)), V::add(a4, a5));
    const F s1 = V::add(V::add(V::add(a6, a7), V::add(a8, a9)), V::add(a10, a11));
    return V::hsum(V::add(s0, s1));
  }

  static KernelTable table(const char* name) {
    KernelTable t{};
    t.fma_loop = &fma_loop;
    t.fma_loop_flops = 2 * L * kPeakChains;
    t.name = name;
    t.matmul[static_cast<int>(WeightFormat::kF32)] = &matmul<WeightFormat::kF32>;
    t.matmul[static_cast<int>(WeightFormat::kBF16)] = &matmul<WeightFormat::kBF16>;
    t.matmul[static_cast<int>(WeightFormat::kMXFP4)] = &matmul<WeightFormat::kMXFP4>;
    t.matmul[static_cast<int>(WeightFormat::kInt8)] = &matmul<WeightFormat::kInt8>;
    t.matmul_t[static_cast<int>(WeightFormat::kF32)] = &matmul_t<WeightFormat::kF32>;
    t.matmul_t[static_cast<int>(WeightFormat::kBF16)] = &matmul_t<WeightFormat::kBF16>;
    t.matmul_t[static_cast<int>(WeightFormat::kMXFP4)] = &matmul_t<WeightFormat::kMXFP4>;
    t.matmul_t[static_cast<int>(WeightFormat::kInt8)] = &matmul_t<WeightFormat::kInt8>;
    t.matmul[static_cast<int>(WeightFormat::kFP8)] = &matmul<WeightFormat::kFP8>;
    t.matmul[static_cast<int>(WeightFormat::kInt4)] = &matmul<WeightFormat::kInt4>;
    t.matmul_t[static_cast<int>(WeightFormat::kFP8)] = &matmul_t<WeightFormat::kFP8>;
    t.matmul_t[static_cast<int>(WeightFormat::kInt4)] = &matmul_t<WeightFormat::kInt4>;
    t.dot = &dot;
    t.axpy = &axpy;
    t.exp = &map<&V::exp>;
    t.tanh = &map<&V::tanh>;
    return t;
  }
};

}  // namespace
}  // namespace deltafin::kernels
