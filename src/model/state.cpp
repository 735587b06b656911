#include "model/state.h"

#include <algorithm>

#include "core/error.h"
#include "core/fault_inject.h"

namespace deltafin {

StateShape StateShape::of(const ModelConfig& c) {
  StateShape s;
  const int64_t dk = c.kda.head_dim;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.is_mla(i)) {
      s.mla.push_back(c.mla.cache_width());
    } else {
      s.kda.push_back({static_cast<size_t>(c.kda.num_heads * dk * dk),
                       static_cast<size_t>((c.kda.conv_kernel - 1) * 3 * c.kda.proj_dim())});
    }
  }
  return s;
}

State::State(const ModelConfig& c) {
  alloc_fault("sequence state");  // tests: DELTAFIN_FAULT=kind=oom (core/fault_inject.h)
  const StateShape shape = StateShape::of(c);
  size_t k = 0, m = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.is_mla(i)) {
      layer_slot_.push_back({-1, static_cast<int>(mla_.size())});
      MlaLayerCache cache;
      cache.width = shape.mla[m++];
      mla_.push_back(std::move(cache));
    } else {
      layer_slot_.push_back({static_cast<int>(kda_.size()), -1});
      KdaLayerState layer;
      layer.S.assign(shape.kda[k].first, 0.0f);
      layer.conv.assign(shape.kda[k].second, 0.0f);
      ++k;
      kda_.push_back(std::move(layer));
    }
  }
}

StateShape State::shape() const {
  StateShape s;
  for (const auto& k : kda_) s.kda.push_back({k.S.size(), k.conv.size()});
  for (const auto& m : mla_) s.mla.push_back(m.width);
  return s;
}

void State::reset() {
  position_ = 0;
  consistent_ = true;
  for (auto& k : kda_) {
    std::fill(k.S.begin(), k.S.end(), 0.0f);
    std::fill(k.conv.begin(), k.conv.end(), 0.0f);
  }
  for (auto& m : mla_) m.rows.clear();
  if (taps_) taps_->clear();
}

void State::truncate(int64_t n) {
  if (n < 0 || n > position_) fail("cannot truncate a state at position {} to {}", position_, n);
  for (auto& m : mla_) {
    if (m.length() > n) m.rows.resize(static_cast<size_t>(n * m.width));
  }
  position_ = n;
  if (taps_) taps_->truncate(n);
}

bool State::compatible(const State& o) const {
  if (kda_.size() != o.kda_.size() || mla_.size() != o.mla_.size()) return false;
  for (size_t i = 0; i < kda_.size(); ++i) {
    if (kda_[i].S.size() != o.kda_[i].S.size() || kda_[i].conv.size() != o.kda_[i].conv.size())
      return false;
  }
  for (size_t i = 0; i < mla_.size(); ++i) {
    if (mla_[i].width != o.mla_[i].width) return false;
  }
  return true;
}

void State::restore(const State& s) {
  if (!compatible(s)) fail("cannot restore a state saved for a different model shape");
  *this = s;
}

uint64_t State::bytes() const {
  uint64_t n = 0;
  for (const auto& k : kda_) n += (k.S.size() + k.conv.size()) * sizeof(float);
  for (const auto& m : mla_) n += m.rows.size() * sizeof(float);
  return n;
}

}  // namespace deltafin
