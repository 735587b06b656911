// The chunked form of the KDA delta rule (docs/MODEL.md §3.5), for one head over a run of rows:
// within a chunk of C rows the recurrence becomes small dense products (the UT/WY form FLA uses):
//   A[r,i] = Σ_d k_r k_i exp(G_r − G_i)           (i < r)
//   δ_r    = β_r (v_r − S₀ᵀ(exp(G_r) ⊙ k_r) − Σ_{i<r} A[r,i] δ_i)
//   o_r    = S₀ᵀ(exp(G_r) ⊙ q_r) + Σ_{i≤r} δ_i Σ_d k_i q_r exp(G_r − G_i)
//   S_C    = diag(exp(G_C)) S₀ + Σ_i (exp(G_C − G_i) ⊙ k_i) δ_iᵀ
// with G the cumulative log decay. exp(G_r − G_i) factors through the chunk's first row as
// e_r / e_i with e_r = α_1 ⋯ α_r (a running product of the decays the caller already has, so no
// exponentials are needed). That factoring is exact only while 1/e_r stays far inside fp32
// range, so a chunk ends before the row whose running product would fall below kMinProduct
// (2^-110) in any channel, and the next chunk starts there with its own products: every factor
// is then ≤ 1 or ≤ 2^110, nothing overflows, and a decay that underflows to 0 (Kimi-Linear's
// unbounded decay, docs/FAMILY.md KL.5) just starts a chunk whose first row's α multiplies S₀
// (the state forgets, as in the stepwise form). K3's gate lower bound keeps
// e_r ≥ exp(−5·15) ≈ 2.7e-33 > 2^-110 for the 16-row windows, so its chunks are always whole
// windows, exactly as before the cut existed. Chunks are cut within fixed 16-row windows from
// the first row, so where a pass is split into blocks (multiples of 16) never shows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "model/layers.h"

namespace deltafin {

void kda_chunk_head(float* S, int64_t dk, int64_t dv, int64_t T, const float* q, const float* k,
                    const float* v, const float* alpha, const float* beta, int64_t row_stride,
                    int64_t alpha_stride, int64_t beta_stride, float* o, int64_t o_stride) {
  constexpr int64_t kC = 16;
  const float kMinProduct = std::ldexp(1.0f, -110);
  const auto& K = kernels::active();
  std::vector<float> e(static_cast<size_t>(kC * dk));
  std::vector<float> kp(static_cast<size_t>(kC * dk)), km(static_cast<size_t>(kC * dk));
  std::vector<float> qp(static_cast<size_t>(kC * dk)), kend(static_cast<size_t>(kC * dk));
  std::vector<float> delta(static_cast<size_t>(kC * dv));
  std::vector<float> sk(static_cast<size_t>(kC * dk)), sq(static_cast<size_t>(kC * dk));
  const kernels::MatmulTFn mt = kernels::matmul_t_fn(WeightFormat::kF32);
  Matrix s0;  // S₀ as a [dk, dv] f32 matrix (the state at the chunk's start)
  s0.format = WeightFormat::kF32;
  s0.rows = dk;
  s0.cols = dv;
  s0.data = S;
  std::vector<float> A(static_cast<size_t>(kC * kC)), QK(static_cast<size_t>(kC * kC));
  int64_t C = 0;
  for (int64_t c0 = 0; c0 < T; c0 += C) {
    // The chunk: rows c0 .. c0 + C − 1, inside c0's 16-row window, while every running product
    // stays >= kMinProduct.
    const int64_t window_end = std::min(T, (c0 / kC + 1) * kC);
    const float* a0 = alpha + c0 * alpha_stride;  // exp(G_0): the first row's own decay
    C = window_end - c0;
    for (int64_t r = 0; r < C; ++r) {
      const float* ar = alpha + (c0 + r) * alpha_stride;
      for (int64_t d = 0; d < dk; ++d) e[r * dk + d] = r == 0 ? 1.0f : e[(r - 1) * dk + d] * ar[d];
    }
    // Decays are ≤ 1 (g ≤ 0 in every family), so each channel's product only falls: the last
    // row holds the smallest. Only when it is below the bound is the first such row looked for.
    auto below = [&](int64_t r) {
      for (int64_t d = 0; d < dk; ++d) {
        if (!(e[r * dk + d] >= kMinProduct)) return true;
      }
      return false;
    };
    if (below(C - 1)) {
      int64_t r = 1;
      while (!below(r)) ++r;
      C = r;  // row r starts the next chunk
    }
    const float* elast = e.data() + (C - 1) * dk;
    for (int64_t r = 0; r < C; ++r) {
      const float* kr = k + (c0 + r) * row_stride;
      const float* qr = q + (c0 + r) * row_stride;
      for (int64_t d = 0; d < dk; ++d) {
        const float er = e[r * dk + d];
        kp[r * dk + d] = kr[d] * er;                 // k_r exp(G_r − G_0)
        km[r * dk + d] = kr[d] / er;                 // k_r exp(G_0 − G_r)
        qp[r * dk + d] = qr[d] * er;                 // q_r exp(G_r − G_0)
        kend[r * dk + d] = kr[d] * (elast[d] / er);  // k_r exp(G_last − G_r)
      }
    }
    for (int64_t r = 0; r < C; ++r) {
      for (int64_t i = 0; i <= r; ++i) {
        if (i < r) A[r * kC + i] = K.dot(kp.data() + r * dk, km.data() + i * dk, dk);
        QK[r * kC + i] = K.dot(qp.data() + r * dk, km.data() + i * dk, dk);
      }
    }
    // The S₀ terms of every row of the chunk (they use exp(G_r) = exp(G_r − G_0) · exp(G_0)) are
    // two transposed products with S₀, which read S₀ once per chunk instead of once per row:
    // the same FMAs, in the same order (over d, into the row), as one axpy per S₀ row.
    for (int64_t r = 0; r < C; ++r) {
      std::memcpy(delta.data() + r * dv, v + (c0 + r) * row_stride,
                  static_cast<size_t>(dv) * sizeof(float));
      std::memset(o + (c0 + r) * o_stride, 0, static_cast<size_t>(dv) * sizeof(float));
      for (int64_t d = 0; d < dk; ++d) {
        sk[r * dk + d] = -(kp[r * dk + d] * a0[d]);
        sq[r * dk + d] = qp[r * dk + d] * a0[d];
      }
    }
    mt(s0, 0, dv, sk.data(), C, dk, delta.data(), dv);
    mt(s0, 0, dv, sq.data(), C, dk, o + c0 * o_stride, o_stride);
    // δ by forward substitution.
    for (int64_t r = 0; r < C; ++r) {
      float* dr = delta.data() + r * dv;
      for (int64_t i = 0; i < r; ++i) K.axpy(-A[r * kC + i], delta.data() + i * dv, dr, dv);
      const float b = beta[(c0 + r) * beta_stride];
      for (int64_t j = 0; j < dv; ++j) dr[j] *= b;
    }
    for (int64_t r = 0; r < C; ++r) {
      float* orow = o + (c0 + r) * o_stride;
      for (int64_t i = 0; i <= r; ++i) K.axpy(QK[r * kC + i], delta.data() + i * dv, orow, dv);
    }
    // State at the chunk end.
    for (int64_t d = 0; d < dk; ++d) {
      float* row = S + d * dv;
      const float decay = elast[d] * a0[d];
      for (int64_t j = 0; j < dv; ++j) row[j] *= decay;
      for (int64_t i = 0; i < C; ++i) K.axpy(kend[i * dk + d], delta.data() + i * dv, row, dv);
    }
  }
}

}  // namespace deltafin
