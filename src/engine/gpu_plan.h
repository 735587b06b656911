// The GPU side of loading a model (--gpu, --gpu-memory): opens the Vulkan backend the options
// name and plans what lives in device memory. Trunk units whose weights stay put for the
// model's life (every unit with --mmap, the units the memory plan keeps resident otherwise) are
// made resident in order until the budget is spent, so decode runs them on the device; the
// other units and the routed experts run on the device only in passes with enough rows
// (prefill), uploaded per product, and on the CPU otherwise. K3's list of a layer's matrices is
// weights.h's; this file only walks it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpu/options.h"
#include "model/config.h"
#include "model/weights.h"

namespace deltafin {

struct GpuPlan {
  std::string device;          // the selection line
  std::vector<bool> resident;  // per trunk unit (layers, then the head)
  uint64_t resident_bytes = 0;
  std::string describe() const;  // the split, one line
};

// Opens the backend (null when off or when auto finds no GPU) and places the stable units.
// `stable[u]`: unit u's weights stay valid and unchanged while the model lives.
std::shared_ptr<gpu::Backend> attach_gpu(const gpu::Options& o, const ModelConfig& c,
                                         TrunkProvider& trunk, const std::vector<bool>& stable,
                                         GpuPlan& plan);

}  // namespace deltafin
