// The vision tower and projector, one named step per doc section (vision_tower.h;
// docs/VISION.md §4). Row-wise work runs in blocks of kBlockRows rows; attention runs per
// (head, kQueryRows query rows) task on the pool, each task scoring its rows against all keys.
#include "model/vision_tower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/ops.h"
#include "tensor/tensor_info.h"

namespace deltafin {

namespace {

constexpr int64_t kBlockRows = 256;  // rows of norm / projection / MLP work at a time
constexpr int64_t kQueryRows = 16;   // query rows per attention task
constexpr int64_t kMaxGridSide = 4096;

struct VisionBinder {
  const TensorLookup& lookup;
  const TensorInfo& info(const std::string& name, const std::vector<int64_t>& shape) const {
    auto [t, b] = lookup(name);
    (void)b;
    if (t->shape != shape) {
      fail("tensor {}: expected shape {}, found {}", name, shape_to_string(shape),
           t->shape_string());
    }
    return *t;
  }
  Matrix matrix(const std::string& name, const std::vector<int64_t>& shape) const {
    info(name, shape);
    auto [t, b] = lookup(name);
    return weight_matrix(*t, b);
  }
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const {
    info(name, shape);
    auto [t, b] = lookup(name);
    return weight_vector(*t, b);
  }
};

// §4.3: per output index, the source taps and weights of one axis.
struct AxisTaps {
  int n = 0;
  int64_t index[4] = {};
  double weight[4] = {};
};

std::vector<AxisTaps> axis_taps(int64_t in, int64_t out, PosInterpolation mode) {
  std::vector<AxisTaps> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    AxisTaps& t = taps[o];
    const double src = (static_cast<double>(o) + 0.5) * scale - 0.5;
    if (mode == PosInterpolation::kBilinear) {
      const double s = std::max(src, 0.0);
      const int64_t i0 = static_cast<int64_t>(std::floor(s));
      const int64_t i1 = i0 < in - 1 ? i0 + 1 : i0;
      const double l = s - static_cast<double>(i0);
      t.n = 2;
      t.index[0] = i0;
      t.weight[0] = 1.0 - l;
      t.index[1] = i1;
      t.weight[1] = l;
    } else {
      // PyTorch's bicubic: A = -0.75, taps i-1 .. i+2 clamped to the grid.
      const double A = -0.75;
      auto c1 = [&](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
      auto c2 = [&](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
      const double fl = std::floor(src);
      const int64_t i = static_cast<int64_t>(fl);
      const double u = src - fl;
      const double w[4] = {c2(u + 1.0), c1(u), c1(1.0 - u), c2(2.0 - u)};
      t.n = 4;
      for (int j = 0; j < 4; ++j) {
        t.index[j] = std::clamp<int64_t>(i - 1 + j, 0, in - 1);
        t.weight[j] = w[j];
      }
    }
  }
  return taps;
}

// GELU, tanh approximation, in place: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (§4.5).
void gelu_tanh_rows(float* x, int64_t n, std::vector<float>& tmp) {
  tmp.resize(static_cast<size_t>(n));
  const float c = 0.7978845608028654f;  // √(2/π)
  for (int64_t i = 0; i < n; ++i) tmp[i] = c * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
  kernels::active().tanh(tmp.data(), tmp.data(), n);
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + tmp[i]);
}

// GELU, exact: 0.5·x·(1 + erf(x/√2)) (§4.10).
void gelu_erf_rows(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}

void add_bias(float* rows, int64_t n, int64_t width, int64_t ld, const std::vector<float>& b) {
  if (b.empty()) return;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < width; ++i) rows[r * ld + i] += b[i];
  }
}

// Rotates the head vectors of one row in place (§4.6): pairs (2j, 2j+1) by the angle of pair j.
void rotate_heads(float* v, int64_t heads, int64_t hd, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    float* p = v + h * hd;
    for (int64_t j = 0; j < hd / 2; ++j) {
      const float a = p[2 * j], b = p[2 * j + 1];
      p[2 * j] = a * cos[j] - b * sin[j];
      p[2 * j + 1] = a * sin[j] + b * cos[j];
    }
  }
}

}  // namespace

VisionWeights bind_vision(const VisionConfig& v, const TensorLookup& lookup) {
  VisionBinder b{lookup};
  VisionWeights w;
  const int64_t D = v.hidden, P = v.patch, Q = v.qkv, I = v.intermediate;
  {
    const std::string name = "vision_tower.patch_embed.proj.weight";
    TensorInfo t = b.info(name, {D, 3, P, P});
    t.shape = {D, 3 * P * P};  // the conv is a linear map over the patch vector (§4.2)
    w.patch_proj = weight_matrix(t, lookup(name).second);
  }
  if (v.patch_bias) w.patch_bias = b.floats("vision_tower.patch_embed.proj.bias", {D});
  w.pos_emb = b.floats("vision_tower.patch_embed.pos_emb.weight", {v.pos_h, v.pos_w, D});
  for (int64_t i = 0; i < v.layers; ++i) {
    const std::string p = fmt::format("vision_tower.encoder.blocks.{}.", i);
    VisionBlockWeights bw;
    bw.norm0 = b.floats(p + "norm0.weight", {D});
    bw.wqkv = b.matrix(p + "wqkv.weight", {3 * Q, D});
    bw.wo = b.matrix(p + "wo.weight", {D, Q});
    bw.norm1 = b.floats(p + "norm1.weight", {D});
    bw.fc0 = b.matrix(p + "mlp.fc0.weight", {I, D});
    bw.fc1 = b.matrix(p + "mlp.fc1.weight", {D, I});
    if (v.attn_bias) {
      bw.wqkv_bias = b.floats(p + "wqkv.bias", {3 * Q});
      bw.wo_bias = b.floats(p + "wo.bias", {D});
    }
    if (v.linear_bias) {
      bw.fc0_bias = b.floats(p + "mlp.fc0.bias", {I});
      bw.fc1_bias = b.floats(p + "mlp.fc1.bias", {D});
    }
    w.blocks.push_back(std::move(bw));
  }
  w.final_norm = b.floats("vision_tower.encoder.final_layernorm.weight", {D});
  const int64_t M = v.merged_dim();
  w.proj0 = b.matrix("mm_projector.proj.0.weight", {M, M});
  w.proj2 = b.matrix("mm_projector.proj.2.weight", {v.text_hidden, M});
  w.post_norm = b.floats("mm_projector.post_norm.weight", {v.text_hidden});
  return w;
}

std::vector<double> interpolate_pos_emb(const std::vector<float>& grid, int64_t pos_h,
                                        int64_t pos_w, int64_t dim, int64_t h, int64_t w,
                                        PosInterpolation mode) {
  std::vector<double> out(static_cast<size_t>(h * w * dim));
  if (h == pos_h && w == pos_w) {
    std::copy(grid.begin(), grid.end(), out.begin());
    return out;
  }
  const auto ty = axis_taps(pos_h, h, mode);
  const auto tx = axis_taps(pos_w, w, mode);
  // Rows first ([h][pos_w][dim]), then columns.
  std::vector<double> rows(static_cast<size_t>(h * pos_w * dim), 0.0);
  for (int64_t y = 0; y < h; ++y) {
    double* dst = rows.data() + y * pos_w * dim;
    for (int j = 0; j < ty[y].n; ++j) {
      const float* src = grid.data() + ty[y].index[j] * pos_w * dim;
      const double wy = ty[y].weight[j];
      for (int64_t k = 0; k < pos_w * dim; ++k) dst[k] += wy * static_cast<double>(src[k]);
    }
  }
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      double* dst = out.data() + (y * w + x) * dim;
      for (int i = 0; i < tx[x].n; ++i) {
        const double* src = rows.data() + (y * pos_w + tx[x].index[i]) * dim;
        const double wx = tx[x].weight[i];
        for (int64_t d = 0; d < dim; ++d) dst[d] += wx * src[d];
      }
    }
  }
  return out;
}

VisionTower::VisionTower(VisionConfig config, VisionWeights weights)
    : config_(std::move(config)), w_(std::move(weights)) {
  if (static_cast<int64_t>(w_.blocks.size()) != config_.layers)
    fail("vision tower: {} blocks bound, the config has {} layers", w_.blocks.size(),
         config_.layers);
}

int64_t VisionTower::tokens(const VisionGrid& g) const {
  return (g.h / config_.merge_h) * (g.w / config_.merge_w);
}

void VisionTower::check_grid(const VisionGrid& g) const {
  const auto& c = config_;
  if (g.frames < 1 || g.frames > c.pos_t) {
    fail_arg("vision input of {} frames: expected 1 to init_pos_emb_time = {}", g.frames, c.pos_t);
  }
  if (g.h < 1 || g.w < 1 || g.h > kMaxGridSide || g.w > kMaxGridSide || g.h % c.merge_h != 0 ||
      g.w % c.merge_w != 0) {
    fail_arg(
        "vision input grid {}x{} patches: expected sides from 1 to {} that are multiples of the "
        "merge kernel {}x{}",
        g.h, g.w, kMaxGridSide, c.merge_h, c.merge_w);
  }
}

std::vector<float> VisionTower::forward(const float* pixels, const VisionGrid& g, ThreadPool& pool,
                                        const VisionTap& tap) const {
  check_grid(g);
  const VisionConfig& c = config_;
  const int64_t n = g.patches(), hw = g.h * g.w, D = c.hidden, Q = c.qkv, H = c.heads;
  const int64_t hd = c.head_dim(), I = c.intermediate, T = g.frames;
  auto emit = [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
    if (tap) tap(name, data, rows, cols);
  };

  // §4.2 patch embedding: one linear map over each patch vector.
  std::vector<float> x(static_cast<size_t>(n * D));
  kernels::matmul(w_.patch_proj, pixels, n, c.patch_dim(), x.data(), D, pool);
  add_bias(x.data(), n, D, D, w_.patch_bias);
  emit("patch_embed", x.data(), n, D);

  // §4.3 the interpolated position grid, §4.4 the time table (several frames only).
  {
    const std::vector<double> pos =
        interpolate_pos_emb(w_.pos_emb, c.pos_h, c.pos_w, D, g.h, g.w, c.pos_interpolation);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> tau(static_cast<size_t>(D), 0.0);
      if (T > 1) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double omega =
              1.0 / std::pow(10000.0, static_cast<double>(i) / (static_cast<double>(D) / 2.0));
          tau[i] = std::sin(static_cast<double>(t) * omega);
          tau[D / 2 + i] = std::cos(static_cast<double>(t) * omega);
        }
      }
      for (int64_t i = 0; i < hw; ++i) {
        float* row = x.data() + (t * hw + i) * D;
        const double* p = pos.data() + i * D;
        for (int64_t d = 0; d < D; ++d) row[d] += static_cast<float>(p[d] + tau[d]);
      }
    }
  }
  emit("embed", x.data(), n, D);

  // §4.6 the rotation angles of each patch position (the same for every frame and head).
  const int64_t pairs = hd / 2;
  std::vector<float> rope_cos(static_cast<size_t>(hw * pairs)), rope_sin(rope_cos.size());
  for (int64_t r = 0; r < g.h; ++r) {
    for (int64_t col = 0; col < g.w; ++col) {
      for (int64_t j = 0; j < pairs; ++j) {
        const double omega =
            1.0 / std::pow(10000.0, static_cast<double>(4 * (j / 2)) / static_cast<double>(hd));
        const double phi = static_cast<double>(j % 2 == 0 ? col : r) * omega;
        rope_cos[(r * g.w + col) * pairs + j] = static_cast<float>(std::cos(phi));
        rope_sin[(r * g.w + col) * pairs + j] = static_cast<float>(std::sin(phi));
      }
    }
  }
  auto rope_row = [&](int64_t row) { return (row % hw) * pairs; };

  // §4.5 the encoder layers.
  const int64_t block = std::min(kBlockRows, n);
  std::vector<float> K(static_cast<size_t>(H * n * hd)), V(K.size());
  std::vector<float> y(static_cast<size_t>(block * D)), kv(static_cast<size_t>(block * 2 * Q));
  std::vector<float> q(static_cast<size_t>(block * Q)), o(q.size());
  std::vector<float> mlp(static_cast<size_t>(block * I)), gelu_tmp;
  std::vector<std::vector<float>> scores(static_cast<size_t>(pool.size()));
  const kernels::MatmulFn mm_f32 = kernels::matmul_fn(WeightFormat::kF32);
  const kernels::MatmulTFn mmt_f32 = kernels::matmul_t_fn(WeightFormat::kF32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float eps = c.tower_norm_eps;
  auto norm_rows = [&](const std::vector<float>& weight, int64_t r0, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
      ops::rmsnorm(x.data() + (r0 + r) * D, weight.data(), eps, D, y.data() + r * D);
  };

  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const VisionBlockWeights& bw = w_.blocks[static_cast<size_t>(layer)];
    const Matrix wq = bw.wqkv.row_slice(0, Q), wkv = bw.wqkv.row_slice(Q, 3 * Q);
    // Keys and values of every row, from the layer's input, rotated keys, per head.
    for (int64_t r0 = 0; r0 < n; r0 += block) {
      const int64_t rows = std::min(block, n - r0);
      norm_rows(bw.norm0, r0, rows);
      kernels::matmul(wkv, y.data(), rows, D, kv.data(), 2 * Q, pool);
      if (!bw.wqkv_bias.empty()) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < 2 * Q; ++i) kv[r * 2 * Q + i] += bw.wqkv_bias[Q + i];
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* k = kv.data() + r * 2 * Q;
        const int64_t rr = rope_row(r0 + r);
        rotate_heads(k, H, hd, rope_cos.data() + rr, rope_sin.data() + rr);
        for (int64_t h = 0; h < H; ++h) {
          std::copy_n(k + h * hd, hd, K.data() + (h * n + r0 + r) * hd);
          std::copy_n(k + Q + h * hd, hd, V.data() + (h * n + r0 + r) * hd);
        }
      }
    }
    // Per block of rows: queries, attention over all keys, output projection, then the MLP.
    for (int64_t r0 = 0; r0 < n; r0 += block) {
      const int64_t rows = std::min(block, n - r0);
      norm_rows(bw.norm0, r0, rows);
      kernels::matmul(wq, y.data(), rows, D, q.data(), Q, pool);
      add_bias(q.data(), rows, Q, Q, bw.wqkv_bias);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t rr = rope_row(r0 + r);
        rotate_heads(q.data() + r * Q, H, hd, rope_cos.data() + rr, rope_sin.data() + rr);
      }
      std::fill(o.begin(), o.begin() + rows * Q, 0.0f);
      const int64_t qblocks = (rows + kQueryRows - 1) / kQueryRows;
      pool.run(static_cast<int>(H * qblocks), [&](int task, int thread) {
        const int64_t h = task / qblocks, m0 = (task % qblocks) * kQueryRows;
        const int64_t m = std::min(kQueryRows, rows - m0);
        std::vector<float>& s = scores[static_cast<size_t>(thread)];
        s.resize(static_cast<size_t>(kQueryRows * n));
        Matrix kh{WeightFormat::kF32, n, hd, K.data() + h * n * hd, nullptr};
        Matrix vh{WeightFormat::kF32, n, hd, V.data() + h * n * hd, nullptr};
        mm_f32(kh, 0, n, q.data() + m0 * Q + h * hd, m, Q, s.data(), n, false);
        for (int64_t i = 0; i < m; ++i) {
          float* row = s.data() + i * n;
          float mx = -INFINITY;
          for (int64_t j = 0; j < n; ++j) {
            row[j] *= scale;
            mx = std::max(mx, row[j]);
          }
          for (int64_t j = 0; j < n; ++j) row[j] -= mx;
          kernels::active().exp(row, row, n);
          double sum = 0.0;
          for (int64_t j = 0; j < n; ++j) sum += row[j];
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) row[j] *= inv;
        }
        mmt_f32(vh, 0, hd, s.data(), m, n, o.data() + m0 * Q + h * hd, Q);
      });
      float* xb = x.data() + r0 * D;
      kernels::matmul(bw.wo, o.data(), rows, Q, xb, D, pool, /*accumulate=*/true);
      add_bias(xb, rows, D, D, bw.wo_bias);
      norm_rows(bw.norm1, r0, rows);
      kernels::matmul(bw.fc0, y.data(), rows, D, mlp.data(), I, pool);
      add_bias(mlp.data(), rows, I, I, bw.fc0_bias);
      if (c.activation == VisionActivation::kGeluTanh) {
        gelu_tanh_rows(mlp.data(), rows * I, gelu_tmp);
      } else {
        gelu_erf_rows(mlp.data(), rows * I);
      }
      kernels::matmul(bw.fc1, mlp.data(), rows, I, xb, D, pool, /*accumulate=*/true);
      add_bias(xb, rows, D, D, bw.fc1_bias);
    }
    if (tap) emit(fmt::format("block{}", layer), x.data(), n, D);
  }
  K = {};
  V = {};

  // §4.8 final norm.
  for (int64_t r = 0; r < n; ++r) {
    float* row = x.data() + r * D;
    ops::rmsnorm(row, w_.final_norm.data(), eps, D, row);
  }
  emit("final_norm", x.data(), n, D);

  // §4.9 the merger: merge_h × merge_w neighbours side by side, averaged over frames.
  const int64_t mh = c.merge_h, mw = c.merge_w, gw2 = g.w / mw, tokens = this->tokens(g);
  const int64_t M = c.merged_dim();
  std::vector<float> z(static_cast<size_t>(tokens * M), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t m = 0; m < tokens; ++m) {
      const int64_t R = m / gw2, C = m % gw2;
      for (int64_t a = 0; a < mh; ++a) {
        for (int64_t b = 0; b < mw; ++b) {
          const float* src = x.data() + (t * hw + (R * mh + a) * g.w + (C * mw + b)) * D;
          float* dst = z.data() + m * M + (a * mw + b) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
        }
      }
    }
  }
  if (T > 1) {
    const float tf = static_cast<float>(T);
    for (float& v : z) v /= tf;
  }
  x = {};
  emit("merged", z.data(), tokens, M);

  // §4.10 the projector: proj.0, exact GELU, proj.2, post RMSNorm (projector_ln_eps).
  std::vector<float> out(static_cast<size_t>(tokens * c.text_hidden));
  std::vector<float> h0(static_cast<size_t>(std::min(kBlockRows, tokens) * M));
  for (int64_t r0 = 0; r0 < tokens; r0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, tokens - r0);
    kernels::matmul(w_.proj0, z.data() + r0 * M, rows, M, h0.data(), M, pool);
    gelu_erf_rows(h0.data(), rows * M);
    kernels::matmul(w_.proj2, h0.data(), rows, M, out.data() + r0 * c.text_hidden, c.text_hidden,
                    pool);
  }
  emit("projector_pre_norm", out.data(), tokens, c.text_hidden);
  for (int64_t r = 0; r < tokens; ++r) {
    float* row = out.data() + r * c.text_hidden;
    ops::rmsnorm(row, w_.post_norm.data(), c.projector_eps, c.text_hidden, row);
  }
  return out;
}

VisionCost vision_cost(const VisionConfig& v) {
  VisionCost c;
  for (const ExpectedTensor& e : expected_vision_tensors(v)) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    (e.name.rfind("mm_projector.", 0) == 0 ? c.projector_params : c.tower_params) += n;
    c.weight_bytes += static_cast<uint64_t>(n) * dtype_size(e.dtype);
    // bind_vision copies every tensor but the matrices (2-D and the 4-D patch kernel) to float32.
    const bool matrix = e.shape.size() >= 2 && e.name.find("pos_emb") == std::string::npos;
    if (!matrix) c.weight_bytes += static_cast<uint64_t>(n) * sizeof(float);
  }
  return c;
}

uint64_t vision_work_bytes(const VisionConfig& v, int64_t patches, int threads) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(patches, 0));
  const auto D = static_cast<uint64_t>(v.hidden), Q = static_cast<uint64_t>(v.qkv);
  const auto I = static_cast<uint64_t>(v.intermediate), hd = static_cast<uint64_t>(v.head_dim());
  const auto block = static_cast<uint64_t>(std::min<int64_t>(kBlockRows, patches));
  const uint64_t tokens = n / static_cast<uint64_t>(v.merge_h * v.merge_w);
  const uint64_t f = sizeof(float);
  const uint64_t pixels = n * static_cast<uint64_t>(v.patch_dim()) * (f + 1);
  const uint64_t out = tokens * static_cast<uint64_t>(v.text_hidden) * f;
  // The phases of forward(), each with the residual stream x [n, D] alive until the merger.
  const uint64_t x = n * D * f;
  const uint64_t embed = x + n * D * sizeof(double);  // the interpolated grid in double
  const uint64_t scratch = block * (D + 2 * Q + 2 * Q + 2 * I) * f;  // y, kv, q, o, mlp, gelu
  const uint64_t scores =
      static_cast<uint64_t>(std::max(threads, 1)) * static_cast<uint64_t>(kQueryRows) * n * f;
  const uint64_t layers = x + 2 * n * Q * f + n * hd * f + scratch + scores;
  const uint64_t merger = x + tokens * static_cast<uint64_t>(v.merged_dim()) * f;
  const uint64_t projector =
      tokens * static_cast<uint64_t>(v.merged_dim()) * f + out +
      std::min<uint64_t>(kBlockRows, tokens) * static_cast<uint64_t>(v.merged_dim()) * f;
  return pixels + std::max({embed, layers, merger, projector}) + out;
}

VisionFlops vision_flops(const VisionConfig& v, const VisionGrid& g) {
  const auto n = static_cast<double>(g.patches());
  const auto tokens = n / static_cast<double>(v.merge_h * v.merge_w);
  const auto D = static_cast<double>(v.hidden), Q = static_cast<double>(v.qkv);
  const auto I = static_cast<double>(v.intermediate), M = static_cast<double>(v.merged_dim());
  VisionFlops f;
  const double per_layer = 3 * Q * D + Q * D + 2 * I * D;
  f.linear =
      2 * n * (static_cast<double>(v.patch_dim()) * D + static_cast<double>(v.layers) * per_layer) +
      2 * tokens * (M * M + static_cast<double>(v.text_hidden) * M);
  f.attention = 2 * 2 * n * n * Q * static_cast<double>(v.layers);
  return f;
}

}  // namespace deltafin
