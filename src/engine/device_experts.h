// Routed experts of prefill passes on another device (the engine's --gpu). A DeviceExperts is the
// model's expert provider when a GPU backend is open: it forwards everything to the storage
// provider it wraps, and carries out a routed-expert step (model/experts.h: ExpertStep) itself
// when the device takes grouped products for a pass of that many rows — experts are gathered in
// windows as their weights arrive, and each window runs as two grouped products on the device
// (gate and up of all its experts over their rows, then down) with the step's activation between
// them on the CPU, so each expert's weights go to the device once per pass. A window the device
// declines runs on the CPU exactly as without it; so do steps the device does not take (decode).
//
// This is scheduling, not math: the products and the activation are the step's, and each expert
// writes only its own rows' outputs, so the result is the CPU's up to fp32 summation order.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/offload.h"
#include "model/experts.h"

namespace deltafin {

class DeviceExperts : public ExpertProvider {
 public:
  // Experts gathered before a window goes to the device: enough for long grouped products whose
  // uploads overlap, few enough that pinning them all asks little of an expert store's budget.
  static constexpr size_t kWindow = 16;

  DeviceExperts(std::unique_ptr<ExpertProvider> storage,
                std::shared_ptr<kernels::MatmulOffload> device);

  void run(const ExpertStep& step) override;

  uint64_t expert_bytes() const override { return storage_->expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override {
    return storage_->request(layer, experts);
  }
  ExpertHandle acquire(int layer, int expert) override { return storage_->acquire(layer, expert); }
  void prefetch(int layer, std::span<const int> experts) override {
    storage_->prefetch(layer, experts);
  }
  bool wants_prefetch() const override { return storage_->wants_prefetch(); }
  std::vector<LayerRecall> recall() const override { return storage_->recall(); }
  ExpertStats stats() const override { return storage_->stats(); }
  ExpertHeat heat() const override { return storage_->heat(); }
  std::string describe() const override { return storage_->describe(); }
  ExpertProvider& storage() { return *storage_; }

 private:
  using Window = std::vector<std::pair<int, ExpertHandle>>;  // (expert id, pinned weights)
  bool run_on_device(const ExpertStep& step, const Window& window);

  std::unique_ptr<ExpertProvider> storage_;
  std::shared_ptr<kernels::MatmulOffload> device_;
};

// Runs every pass of a model with `device` offered its matrix products (kernels/offload.h), for
// ModelParts::pass_environment.
std::function<void(const std::function<void()>&)> offload_environment(
    std::shared_ptr<kernels::MatmulOffload> device);

}  // namespace deltafin
