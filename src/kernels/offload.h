// The one seam through which another device (src/gpu: Vulkan) takes matrix products off the
// CPU. Model code keeps calling kernels::matmul; while an OffloadScope is active on the calling
// thread (Model::forward installs the model's offload for the length of a pass), matmul first
// offers the product to the offload, which either computes it — y exactly as matmul would
// define it, in fp32 — or declines, and then the CPU table computes it as always. So the K3
// layers exist once, the GPU supplies matmuls only, and a model without an offload (or a
// product the device declines: int8 weights, a device error) runs exactly as before.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace deltafin::kernels {

class MatmulOffload {
 public:
  virtual ~MatmulOffload() = default;
  // y[m*ldy + n] = (accumulate ? y : 0) + sum_k x[m*ldx + k] * W(n, k) for all n, m < M.
  // Returns false, leaving y untouched, when it does not take the product.
  virtual bool matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y,
                      int64_t ldy, bool accumulate) = 0;
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
