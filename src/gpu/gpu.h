// The GPU backend: Vulkan compute for the matrix products of a pass (docs/ARCHITECTURE.md,
// "GPU"). Vulkan because the same SPIR-V runs on NVIDIA, AMD and Intel GPUs, on Macs through
// MoltenVK, and on lavapipe (Mesa's CPU driver) — so every kernel is tested on machines without
// a GPU. The loader (libvulkan.so.1) is opened at run time: a binary built with Vulkan runs on
// machines without it, on the CPU.
//
// What runs here: y = x·Wᵀ for f32, bf16, MXFP4, FP8 (128x128 block scales) and INT4
// (pack-quantized) weights (the model's projections, through
// kernels/offload.h) and the expert-grouped product (several experts' W, each over its own
// rows: the MoE's routed experts in prefill passes, uploaded once per pass in double-buffered
// batches that overlap the copy of one batch with the compute of the one before).
// Exactness: weights are decoded exactly to fp32, activations stay fp32, sums are fp32
// (matmul.comp states the order); results differ from the CPU tables in the last bits only.
// Nothing lossy: no fp16/bf16/int8 activations, no low-precision matrix units. int8 weights
// (--trunk int8) are declined and stay on the CPU.
//
// Memory: weights that stay valid for the model's life (the resident trunk) may be made
// resident in device memory under a budget (--gpu-memory); other weights are uploaded for the
// product that needs them, only when the product has enough rows to pay for the upload
// (prefill). Every buffer is split within the device's storage-buffer limit (lavapipe: 128 MiB).
// Uploads go through a host-visible staging buffer when device memory is not host-visible; on
// unified-memory devices (integrated GPUs, lavapipe, Apple through MoltenVK) weights are
// imported zero-copy (VK_EXT_external_memory_host) where the driver allows.
//
// Errors: a device error during a product makes the backend say so once on stderr and decline
// every later product, so the pass (and the run) continues on the CPU with the same result.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/options.h"
#include "kernels/offload.h"
#include "tensor/matrix.h"

namespace deltafin::gpu {

// Whether this build has the Vulkan backend (headers and glslc were found at configure time).
bool compiled_in();

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string type;  // discrete, integrated, virtual, cpu, other
  uint32_t api_version = 0;
  uint64_t device_local_bytes = 0;  // largest device-local heap
  uint64_t max_buffer_bytes = 0;    // maxStorageBufferRange
  bool host_import = false;         // VK_EXT_external_memory_host
  bool unified = false;             // integrated / cpu: device memory is system memory
  std::string describe() const;     // one line
};

// The Vulkan devices of this machine; `error` says why there are none (no loader, no driver).
struct Probe {
  std::vector<DeviceInfo> devices;
  std::string error;
};
Probe probe();

struct Stats {
  int64_t products = 0;         // products run on the device
  int64_t declined = 0;         // products left to the CPU
  int64_t rows = 0;             // x rows through device products
  double flops = 0;             // 2 * M * N * K summed
  uint64_t uploaded_bytes = 0;  // weight bytes copied to the device for one product
  uint64_t imported_bytes = 0;  // weight bytes used zero-copy for one product
  // Expert-grouped products (the routed experts of prefill passes), and of uploaded_bytes
  // those that were expert weights and those copied while the device was still computing an
  // earlier batch of the same product (the double-buffered staging).
  int64_t grouped_products = 0;
  uint64_t expert_bytes = 0;
  uint64_t overlapped_bytes = 0;
  double seconds = 0;  // wall time inside device products
};

// One row group of an expert-grouped product: x rows `rows` use weights `w`.
using Group = kernels::RowGroup;

class Device;

class Backend : public kernels::MatmulOffload {
 public:
  ~Backend() override;
  // Opens the device `o.select` names. Returns null when `off`, or when `auto` finds no GPU
  // (lavapipe and other CPU devices are chosen only by index). `line` is set to one sentence
  // saying what was chosen and why. A device that is named by index but absent, or fails to
  // open, throws InvalidArgument / Error naming it.
  static std::unique_ptr<Backend> open(const Options& o, std::string& line);

  const DeviceInfo& info() const;
  const Options& options() const { return options_; }

  // kernels::MatmulOffload: runs the product on the device when its weights are resident or it
  // has at least min_rows rows; false (y untouched) when declined or after a device error.
  bool matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) override;

  // The same product, always on the device; throws Error on a device error (tests, gpu-check).
  void run(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
           bool accumulate);
  // Expert-grouped product: for each group g and each i, y[(sum of earlier groups' rows) + i]
  // = x[rows_g[i]] · W_gᵀ (y dense, [total rows][N]). Every W has the same shape and format.
  // Each group's W is uploaded once (a group with more rows than one buffer holds: once per
  // buffer of rows); groups are cut into batches, each uploaded into one of two buffer sets
  // while the device computes the batch before it. Throws Error on a device error.
  void run_grouped(std::span<const Group> groups, const float* x, int64_t ldx, float* y);
  // kernels::MatmulOffload: the MoE's routed experts in passes of at least min_rows rows; a
  // device error is said once and declines (the pass's experts then run on the CPU).
  bool takes_grouped(int64_t pass_rows) const override;
  bool grouped(std::span<const Group> groups, const float* x, int64_t ldx, float* y) override;

  // Keeps `w` in device memory for the backend's life (the caller keeps its bytes valid and
  // unchanged as long): true when it is (or already was) resident, false when the budget is
  // spent or the format is not supported.
  bool make_resident(const Matrix& w);
  uint64_t resident_bytes() const;
  uint64_t budget_bytes() const;
  bool failed() const;  // a device error switched it to the CPU
  Stats stats() const;

  struct State;  // backend.cpp's (named here so its helpers can take it)

 private:
  Backend(Options o, std::unique_ptr<Device> d);
  uint64_t range_limit() const;
  std::vector<float> product(const Matrix& w, const float* x, int64_t M, int64_t ldx);
  void grouped_product(std::span<const Group> groups, const float* x, int64_t ldx, float* y);
  void note_failure(const std::exception& e);  // says it once; later products decline
  Options options_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<State> state_;
};

}  // namespace deltafin::gpu
