#include "storage/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace deltafin {

Placement plan_placement(const PlacementRequest& r) {
  const size_t n = r.heat.size(), H = r.home_bandwidth.size();
  if (r.bytes.size() != n || r.home_capacity.size() != H)
    fail_arg("placement: {} heats, {} sizes, {} bandwidths, {} capacities", n, r.bytes.size(), H,
             r.home_capacity.size());
  if (!(r.model_bandwidth > 0))
    fail_arg("placement: the model folder's bandwidth must be positive");
  for (double b : r.home_bandwidth) {
    if (!(b > 0)) fail_arg("placement: a home's bandwidth must be positive");
  }
  if (!(r.replicate >= 0 && r.replicate <= 1))
    fail_arg("placement: the replicated share {} is not between 0 and 1", r.replicate);

  double total_bw = r.model_bandwidth;
  for (double b : r.home_bandwidth) total_bw += b;
  std::vector<double> load_of(n);  // expected bytes a pass reads of each expert (relative)
  double total = 0;
  for (size_t e = 0; e < n; ++e) {
    load_of[e] = std::max(0.0, r.heat[e]) * static_cast<double>(r.bytes[e]);
    total += load_of[e];
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return r.heat[a] > r.heat[b]; });

  Placement p;
  p.homes.resize(H);
  std::vector<double> load(H, 0.0), target(H);
  double model_load = 0;
  std::vector<uint64_t> room = r.home_capacity;
  for (size_t h = 0; h < H; ++h) target[h] = total * r.home_bandwidth[h] / total_bw;

  const auto n_rep = static_cast<size_t>(std::llround(r.replicate * static_cast<double>(n)));
  for (size_t i = 0; i < n; ++i) {
    const size_t e = order[i];
    if (i < n_rep && H > 0) {
      // On every home with room; its reads split over the copies by bandwidth.
      double bw = r.model_bandwidth;
      std::vector<size_t> holders;
      for (size_t h = 0; h < H; ++h) {
        if (room[h] < r.bytes[e]) continue;
        holders.push_back(h);
        bw += r.home_bandwidth[h];
      }
      for (size_t h : holders) {
        room[h] -= r.bytes[e];
        p.homes[h].push_back(e);
        load[h] += load_of[e] * r.home_bandwidth[h] / bw;
      }
      model_load += load_of[e] * r.model_bandwidth / bw;
      if (holders.size() > 1) p.replicated++;
      continue;
    }
    // The home that would finish its expected load first, while below its share.
    int best = -1;
    for (size_t h = 0; h < H; ++h) {
      if (room[h] < r.bytes[e] || load[h] + load_of[e] / 2 > target[h]) continue;
      if (best < 0 || (load[h] + load_of[e]) / r.home_bandwidth[h] <
                          (load[static_cast<size_t>(best)] + load_of[e]) /
                              r.home_bandwidth[static_cast<size_t>(best)])
        best = static_cast<int>(h);
    }
    // The model folder competes too (it holds every expert already): hot experts are spread over
    // all drives rather than piled on the homes, so each drive gets a like mix of experts the
    // cache tends to keep and experts it must read, and reads split by bandwidth as planned.
    const bool model_first = best < 0 || (model_load + load_of[e]) / r.model_bandwidth <=
                                             (load[static_cast<size_t>(best)] + load_of[e]) /
                                                 r.home_bandwidth[static_cast<size_t>(best)];
    if (model_first) {
      model_load += load_of[e];
      continue;
    }
    const auto h = static_cast<size_t>(best);
    room[h] -= r.bytes[e];
    load[h] += load_of[e];
    p.homes[h].push_back(e);
  }
  for (auto& list : p.homes) std::sort(list.begin(), list.end());
  p.share.push_back(total > 0 ? model_load / total : 1.0);
  for (size_t h = 0; h < H; ++h) p.share.push_back(total > 0 ? load[h] / total : 0.0);
  return p;
}

}  // namespace deltafin
