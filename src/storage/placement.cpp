#include "storage/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace deltafin {

namespace {

// Step 3: each home's spare room takes the hottest experts it does not hold yet.
void fill_spare_room(const PlacementRequest& r, const std::vector<size_t>& order,
                     std::vector<uint64_t>& room, Placement& p) {
  for (size_t h = 0; h < r.spare.size(); ++h) {
    uint64_t spare = r.spare[h];
    std::vector<bool> held(r.heat.size(), false);
    for (size_t e : p.homes[h]) held[e] = true;
    for (size_t e : order) {
      if (held[e] || r.bytes[e] > spare || r.bytes[e] > room[h]) continue;
      spare -= r.bytes[e];
      room[h] -= r.bytes[e];
      p.homes[h].push_back(e);
      p.spare_copies++;
      p.spare_bytes += r.bytes[e];
    }
  }
}

// Shares as the reader serves them: an expert's bytes split over every drive that holds it (the
// model folder holds all) in proportion to their bandwidths.
Placement with_split_shares(const PlacementRequest& r, const std::vector<double>& load_of,
                            double total, Placement p) {
  const size_t n = r.heat.size(), H = r.home_bandwidth.size();
  std::vector<std::vector<size_t>> holders(n);
  for (size_t h = 0; h < H; ++h) {
    for (size_t e : p.homes[h]) holders[e].push_back(h);
  }
  std::vector<double> share(H + 1, 0.0);
  p.replicated = 0;
  for (size_t e = 0; e < n; ++e) {
    double bw = r.model_bandwidth;
    for (size_t h : holders[e]) bw += r.home_bandwidth[h];
    share[0] += load_of[e] * r.model_bandwidth / bw;
    for (size_t h : holders[e]) share[h + 1] += load_of[e] * r.home_bandwidth[h] / bw;
    if (holders[e].size() > 1) p.replicated++;
  }
  for (double& s : share) s = total > 0 ? s / total : 0.0;
  if (total <= 0) share[0] = 1.0;
  p.share = std::move(share);
  return p;
}

}  // namespace

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
  if (!r.spare.empty() && r.spare.size() != H)
    fail_arg("placement: {} spare rooms for {} homes", r.spare.size(), H);

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
  fill_spare_room(r, order, room, p);
  for (auto& list : p.homes) std::sort(list.begin(), list.end());
  if (p.spare_copies > 0) return with_split_shares(r, load_of, total, std::move(p));
  p.share.push_back(total > 0 ? model_load / total : 1.0);
  for (size_t h = 0; h < H; ++h) p.share.push_back(total > 0 ? load[h] / total : 0.0);
  return p;
}

}  // namespace deltafin
