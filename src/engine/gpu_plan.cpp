// See gpu_plan.h.
#include "engine/gpu_plan.h"

#include "core/error.h"
#include "gpu/gpu.h"

namespace deltafin {

namespace {

// The matrices of a layer that the forward pass multiplies through kernels::matmul (MLA's
// kv_b is applied per head in the absorbed form, on the CPU).
std::vector<Matrix> layer_matrices(const LayerWeights& w) {
  std::vector<Matrix> out = {
      w.kda.q,  w.kda.k,           w.kda.v,         w.kda.f_a,        w.kda.f_b,    w.kda.b,
      w.kda.g,  w.kda.o,           w.mla.q_a,       w.mla.q_b,        w.mla.kv_a,   w.mla.g,
      w.mla.o,  w.dense.gate,      w.dense.up,      w.dense.down,     w.moe.router, w.moe.down,
      w.moe.up, w.moe.shared.gate, w.moe.shared.up, w.moe.shared.down};
  std::erase_if(out, [](const Matrix& m) { return !m.valid(); });
  return out;
}

std::string ranges(const std::vector<bool>& on, int layers) {
  std::string s;
  int i = 0;
  while (i < layers) {
    if (!on[static_cast<size_t>(i)]) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < layers && on[static_cast<size_t>(j + 1)]) ++j;
    s += fmt::format("{}{}", s.empty() ? "layers " : ", ",
                     i == j ? fmt::format("{}", i) : fmt::format("{}-{}", i, j));
    i = j + 1;
  }
  if (on.size() > static_cast<size_t>(layers) && on.back()) s += s.empty() ? "head" : " + head";
  return s.empty() ? "none" : s;
}

}  // namespace

std::string GpuPlan::describe() const {
  int n = 0;
  for (bool r : resident) n += r ? 1 : 0;
  const int layers = static_cast<int>(resident.size()) - 1;
  return fmt::format(
      "[gpu] plan: {} of {} trunk units resident on the device ({}; {:.1f} MiB of device "
      "memory); other trunk units: on the device in passes with enough rows (weights uploaded "
      "per product); routed experts: in such passes grouped per expert on the device (each "
      "uploaded once per pass), else on the CPU; KDA recurrence and MLA attention on the CPU",
      n, resident.size(), ranges(resident, layers),
      static_cast<double>(resident_bytes) / (1 << 20));
}

std::shared_ptr<gpu::Backend> attach_gpu(const gpu::Options& o, const ModelConfig& c,
                                         TrunkProvider& trunk, const std::vector<bool>& stable,
                                         GpuPlan& plan) {
  std::unique_ptr<gpu::Backend> b = gpu::Backend::open(o, plan.device);
  if (!b) return nullptr;
  const int L = c.num_layers;
  plan.resident.assign(static_cast<size_t>(L) + 1, false);
  for (int u = 0; u <= L; ++u) {
    if (u >= static_cast<int>(stable.size()) || !stable[static_cast<size_t>(u)]) continue;
    std::vector<Matrix> ms;
    if (u < L) {
      ms = layer_matrices(trunk.acquire(u));
    } else {
      ms = {trunk.acquire_head().lm_head};
    }
    const uint64_t before = b->resident_bytes();
    uint64_t need = 0;
    for (const Matrix& m : ms) need += static_cast<uint64_t>(m.bytes());
    bool all = before + need <= b->budget_bytes() || b->info().unified;
    for (const Matrix& m : ms) all = all && b->make_resident(m);
    if (u < L) {
      trunk.release(u);
    } else {
      trunk.release_head();
    }
    plan.resident[static_cast<size_t>(u)] = all;
  }
  plan.resident_bytes = b->resident_bytes();
  return std::shared_ptr<gpu::Backend>(std::move(b));
}

}  // namespace deltafin
