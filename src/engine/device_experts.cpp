#include "engine/device_experts.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace deltafin {

DeviceExperts::DeviceExperts(std::unique_ptr<ExpertProvider> storage,
                             std::shared_ptr<kernels::MatmulOffload> device)
    : storage_(std::move(storage)), device_(std::move(device)) {
  if (!storage_ || !device_) fail("internal: DeviceExperts needs a provider and a device");
}

void DeviceExperts::run(const ExpertStep& step) {
  if (!device_->takes_grouped(step.rows)) {
    storage_->run(step);
    return;
  }
  Window window;
  auto flush = [&] {
    if (!run_on_device(step, window)) {
      for (const auto& [expert, handle] : window)
        step.apply(*handle, step.users[static_cast<size_t>(expert)]);
    }
    window.clear();
  };
  auto batch = storage_->request(step.layer, step.experts);
  if (step.issued) step.issued();
  size_t index = 0;
  ExpertHandle handle;
  while (batch->next(index, handle)) {
    window.emplace_back(step.experts[index], std::move(handle));
    handle.reset();
    if (window.size() == kWindow) flush();
  }
  if (!window.empty()) flush();
}

// A window of experts as two grouped products on the device; false (nothing written) when the
// device declines either.
bool DeviceExperts::run_on_device(const ExpertStep& step, const Window& window) {
  const int64_t k = step.top_k, Hl = step.in_dim, I = step.inner_dim;
  std::vector<std::vector<int32_t>> rows(window.size());
  int64_t total = 0;
  std::vector<kernels::RowGroup> gate_up, down;
  for (size_t e = 0; e < window.size(); ++e) {
    for (int64_t u : step.users[static_cast<size_t>(window[e].first)])
      rows[e].push_back(static_cast<int32_t>(u / k));
    total += static_cast<int64_t>(rows[e].size());
    gate_up.push_back({window[e].second->w1, rows[e]});
    gate_up.push_back({window[e].second->w3, rows[e]});
  }
  // [expert][gate rows, then up rows][I]
  std::vector<float> gu(static_cast<size_t>(2 * total * I));
  if (!device_->grouped(gate_up, step.in, Hl, gu.data())) return false;
  std::vector<float> h(static_cast<size_t>(total * I));
  std::vector<int32_t> hrows(static_cast<size_t>(total));
  std::iota(hrows.begin(), hrows.end(), 0);
  int64_t at = 0;
  for (size_t e = 0; e < window.size(); ++e) {
    const auto n = static_cast<int64_t>(rows[e].size());
    const float* g = gu.data() + 2 * at * I;
    step.activate(g, g + n * I, n * I, h.data() + at * I);
    down.push_back({window[e].second->w2, std::span<const int32_t>(hrows).subspan(
                                              static_cast<size_t>(at), static_cast<size_t>(n))});
    at += n;
  }
  std::vector<float> y(static_cast<size_t>(total * Hl));
  if (!device_->grouped(down, h.data(), I, y.data())) return false;
  at = 0;
  for (const auto& [expert, handle] : window) {
    for (int64_t u : step.users[static_cast<size_t>(expert)])
      std::copy_n(y.data() + (at++) * Hl, Hl, step.out + u * Hl);
  }
  return true;
}

std::function<void(const std::function<void()>&)> offload_environment(
    std::shared_ptr<kernels::MatmulOffload> device) {
  return [device = std::move(device)](const std::function<void()>& pass) {
    const kernels::OffloadScope scope(device.get());
    pass();
  };
}

}  // namespace deltafin
