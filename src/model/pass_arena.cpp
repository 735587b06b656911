#include "model/pass_arena.h"

#include <cstdlib>
#include <new>

namespace deltafin {
namespace {

constexpr size_t kAlignFloats = 16;  // 64 bytes

size_t aligned(size_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

void free_floats(float* p) {
  std::free(p);
}

}  // namespace

void PassArena::reset() {
  // Several blocks mean a sub-layer outgrew the arena: replace them by one block of what it took,
  // so from the next sub-layer on every buffer comes from that one block.
  if (blocks_.size() > 1) blocks_.clear();
  used_ = 0;
  taken_ = 0;
}

float* PassArena::take(int64_t n) {
  const size_t want = aligned(static_cast<size_t>(n > 0 ? n : 1));
  taken_ += want;
  if (taken_ > want_) want_ = taken_;
  if (blocks_.empty() || used_ + want > blocks_.back().cap) {
    // The first block is sized for the most any sub-layer has taken so far.
    const size_t cap = blocks_.empty() && want_ > want ? want_ : want;
    void* p = std::aligned_alloc(kAlignFloats * sizeof(float), cap * sizeof(float));
    if (p == nullptr) throw std::bad_alloc();
    Block b;
    b.p = std::unique_ptr<float[], void (*)(float*)>(static_cast<float*>(p), &free_floats);
    b.cap = cap;
    blocks_.push_back(std::move(b));
    used_ = 0;
  }
  float* out = blocks_.back().p.get() + used_;
  used_ += want;
  return out;
}

}  // namespace deltafin
