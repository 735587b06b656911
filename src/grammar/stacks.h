// The pushdown automaton's stacks, and stepping a set of them by one byte or one whole token.
//
// A stack is a chain of frames in a StackArena: the top frame's node is the position in the
// current rule, each parent frame's node the position its caller returns to. Frames are
// immutable, so stacks share their common bottoms and copying a set of stacks is copying their
// top frame ids. An arena hash-conses the frames it is asked to (equal stacks then have equal
// ids, which is what lets the precomputation memoise sets of stacks); scratch frames are
// appended without that and dropped again with truncate().
//
// Stepper::close() expands a frame into the stacks a terminal can be matched at: a call pushes
// the return position and enters the callee (a return position that ends its rule with nothing
// after it is not pushed: tail calls do not grow the stack), a node where the rule may end pops
// to the caller, and popping the last frame sets `ended` (the grammar, or in the
// precomputation the rule under study, is complete).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grammar/pda.h"

namespace deltafin::grammar {

struct Frame {
  uint32_t node;
  int32_t parent;  // -1: the bottom
  uint32_t depth;  // frames in the stack, this one included
};

class StackArena {
 public:
  explicit StackArena(bool hash_cons = true) : hash_cons_(hash_cons) {}

  int32_t push(uint32_t node, int32_t parent);
  int32_t push_scratch(uint32_t node, int32_t parent);
  const Frame& operator[](int32_t i) const { return frames_[static_cast<size_t>(i)]; }
  size_t size() const { return frames_.size(); }
  // Drops the frames from `n` on; only scratch frames may be dropped.
  void truncate(size_t n) { frames_.resize(n); }
  void clear();
  // The nodes of stack `x`, bottom first.
  std::vector<uint32_t> nodes(int32_t x) const;

 private:
  void grow();

  bool hash_cons_;
  std::vector<Frame> frames_;
  std::vector<uint64_t> keys_;  // open addressing: (node, parent + 1) packed, 0 = empty
  std::vector<int32_t> vals_;
  size_t used_ = 0;
};

class Stepper {
 public:
  Stepper(const Pda& pda, uint32_t max_depth) : pda_(&pda), max_depth_(max_depth) {}

  // A round is one step of a set of stacks; expansions within a round are deduplicated.
  void begin_round();
  void close(StackArena& a, int32_t x, std::vector<int32_t>& out, bool scratch);
  // Steps every stack of `in` by byte b (or by whole token t) into `out`, closed; `ended` tells
  // whether a path completed at this step.
  void step_byte(StackArena& a, std::span<const int32_t> in, uint8_t b, std::vector<int32_t>& out,
                 bool scratch);
  void step_token(StackArena& a, std::span<const int32_t> in, int32_t t, std::vector<int32_t>& out,
                  bool scratch);

  bool ended = false;
  bool overflow = false;  // a path was dropped at the stack depth limit

 private:
  bool visit(uint32_t node, int32_t parent);

  const Pda* pda_;
  uint32_t max_depth_;
  std::vector<int32_t> work_;
  std::vector<uint64_t> seen_;  // open addressing set with epochs
  std::vector<uint32_t> seen_epoch_;
  uint32_t epoch_ = 1;
  size_t seen_count_ = 0;
};

}  // namespace deltafin::grammar
