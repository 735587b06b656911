#include "grammar/stacks.h"

#include <algorithm>

namespace deltafin::grammar {

namespace {

uint64_t pack(uint32_t node, int32_t parent) {
  return (static_cast<uint64_t>(node) << 32 | static_cast<uint32_t>(parent + 1)) + 1;
}

size_t slot_of(uint64_t key, size_t mask) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(h ^ (h >> 29)) & mask;
}

}  // namespace

void StackArena::clear() {
  frames_.clear();
  keys_.clear();
  vals_.clear();
  used_ = 0;
}

void StackArena::grow() {
  const size_t n = keys_.empty() ? 1024 : keys_.size() * 2;
  std::vector<uint64_t> keys(n, 0);
  std::vector<int32_t> vals(n, -1);
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == 0) continue;
    size_t s = slot_of(keys_[i], n - 1);
    while (keys[s] != 0) s = (s + 1) & (n - 1);
    keys[s] = keys_[i];
    vals[s] = vals_[i];
  }
  keys_.swap(keys);
  vals_.swap(vals);
}

int32_t StackArena::push_scratch(uint32_t node, int32_t parent) {
  const uint32_t depth = parent < 0 ? 1 : frames_[static_cast<size_t>(parent)].depth + 1;
  frames_.push_back({node, parent, depth});
  return static_cast<int32_t>(frames_.size() - 1);
}

int32_t StackArena::push(uint32_t node, int32_t parent) {
  if (!hash_cons_) return push_scratch(node, parent);
  if ((used_ + 1) * 2 > keys_.size()) grow();
  const uint64_t key = pack(node, parent);
  const size_t mask = keys_.size() - 1;
  size_t s = slot_of(key, mask);
  while (keys_[s] != 0) {
    if (keys_[s] == key) return vals_[s];
    s = (s + 1) & mask;
  }
  const int32_t id = push_scratch(node, parent);
  keys_[s] = key;
  vals_[s] = id;
  ++used_;
  return id;
}

std::vector<uint32_t> StackArena::nodes(int32_t x) const {
  std::vector<uint32_t> out;
  for (; x >= 0; x = frames_[static_cast<size_t>(x)].parent)
    out.push_back(frames_[static_cast<size_t>(x)].node);
  std::reverse(out.begin(), out.end());
  return out;
}

void Stepper::begin_round() {
  if (++epoch_ == 0) {
    std::fill(seen_epoch_.begin(), seen_epoch_.end(), 0);
    epoch_ = 1;
  }
  seen_count_ = 0;
}

bool Stepper::visit(uint32_t node, int32_t parent) {
  if ((seen_count_ + 1) * 2 > seen_.size()) {
    // Grow (and rehash this round's entries).
    const size_t n = seen_.empty() ? 64 : seen_.size() * 2;
    std::vector<uint64_t> keys(n, 0);
    std::vector<uint32_t> ep(n, 0);
    for (size_t i = 0; i < seen_.size(); ++i) {
      if (seen_epoch_[i] != epoch_) continue;
      size_t s = slot_of(seen_[i], n - 1);
      while (ep[s] == epoch_) s = (s + 1) & (n - 1);
      keys[s] = seen_[i];
      ep[s] = epoch_;
    }
    seen_.swap(keys);
    seen_epoch_.swap(ep);
  }
  const uint64_t key = pack(node, parent);
  const size_t mask = seen_.size() - 1;
  size_t s = slot_of(key, mask);
  while (seen_epoch_[s] == epoch_) {
    if (seen_[s] == key) return false;
    s = (s + 1) & mask;
  }
  seen_[s] = key;
  seen_epoch_[s] = epoch_;
  ++seen_count_;
  return true;
}

void Stepper::close(StackArena& a, int32_t x, std::vector<int32_t>& out, bool scratch) {
  work_.push_back(x);
  while (!work_.empty()) {
    const int32_t y = work_.back();
    work_.pop_back();
    const Frame f = a[y];
    if (!visit(f.node, f.parent)) continue;
    const Pda::Node& nd = pda_->node(f.node);
    if (nd.terminal) out.push_back(y);
    for (const Pda::CallEdge& c : pda_->calls(f.node)) {
      int32_t base = f.parent;
      if (!pda_->node(c.ret).tail)
        base = scratch ? a.push_scratch(c.ret, f.parent) : a.push(c.ret, f.parent);
      const uint32_t depth = base < 0 ? 0 : a[base].depth;
      if (depth + 1 > max_depth_) {
        overflow = true;
        continue;
      }
      const uint32_t s = pda_->rule_start(c.rule);
      work_.push_back(scratch ? a.push_scratch(s, base) : a.push(s, base));
    }
    if (nd.final) {
      if (f.parent < 0) {
        ended = true;
      } else {
        work_.push_back(f.parent);
      }
    }
  }
}

void Stepper::step_byte(StackArena& a, std::span<const int32_t> in, uint8_t b,
                        std::vector<int32_t>& out, bool scratch) {
  begin_round();
  ended = false;
  for (const int32_t y : in) {
    const Frame f = a[y];
    const uint32_t t = pda_->step(f.node, b);
    if (t == Pda::kNone) continue;
    close(a, scratch ? a.push_scratch(t, f.parent) : a.push(t, f.parent), out, scratch);
  }
}

void Stepper::step_token(StackArena& a, std::span<const int32_t> in, int32_t t,
                         std::vector<int32_t>& out, bool scratch) {
  begin_round();
  ended = false;
  for (const int32_t y : in) {
    const Frame f = a[y];
    for (const Pda::TokenEdge& e : pda_->tokens(f.node)) {
      if ((e.token == t) == e.negated) continue;
      close(a, scratch ? a.push_scratch(e.to, f.parent) : a.push(e.to, f.parent), out, scratch);
    }
  }
}

}  // namespace deltafin::grammar
