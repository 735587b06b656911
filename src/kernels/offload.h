// The one seam through which another device (src/gpu: Vulkan) takes matrix products off the
// CPU. Model code keeps calling kernels::matmul; while an OffloadScope is active on the calling
// thread (Model::forward installs the model's offload for the length of a pass), matmul first
// offers the product to the offload, which either computes it — y exactly as matmul would
// define it, in fp32 — or declines, and then the CPU table computes it as always. So the K3
// layers exist once, the GPU supplies matmuls only, and a model without an offload (or a
// product the device declines: int8 weights, a device error) runs exactly as on the CPU alone.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/matrix.h"

namespace deltafin::kernels {

// One row group of an expert-grouped product: the x rows `rows` use the weights `w`.
struct RowGroup {
  Matrix w;
  std::span<const int32_t> rows;
};

class MatmulOffload {
 public:
  virtual ~MatmulOffload() = default;
  // y[m*ldy + n] = (accumulate ? y : 0) + sum_k x[m*ldx + k] * W(n, k) for all n, m < M.
  // Returns false, leaving y untouched, when it does not take the product.
  virtual bool matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y,
                      int64_t ldy, bool accumulate) = 0;

  // The routed experts of a pass go to grouped() instead of one matmul per expert and matrix
  // when this says so for a pass of `pass_rows` rows (the MoE asks once per layer pass).
  virtual bool takes_grouped(int64_t pass_rows) const {
    (void)pass_rows;
    return false;
  }
  // Expert-grouped product: for each group g and each i, y[(rows of earlier groups) + i] =
  // x[rows_g[i] * ldx ...] · W_gᵀ, y dense [total rows][N]; every W has one shape and format,
  // and each group's W is read once for all its rows. Returns false when it does not take the
  // product: y's contents are then unspecified and the caller computes it on the CPU.
  virtual bool grouped(std::span<const RowGroup> groups, const float* x, int64_t ldx, float* y) {
    (void)groups;
    (void)x;
    (void)ldx;
    (void)y;
    return false;
  }
};

// Installs `offload` (may be null) for kernels::matmul calls made by this thread until the
// scope ends; scopes nest.
class OffloadScope {
 public:
  explicit OffloadScope(MatmulOffload* offload);
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

 private:
  MatmulOffload* previous_;
};

// The offload active on this thread (null when none).
MatmulOffload* current_offload();

}  // namespace deltafin::kernels
