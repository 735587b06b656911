// A grammar compiled to a byte-level pushdown automaton.
//
// Each rule becomes a deterministic automaton (a Thompson NFA over the rule's body, then the
// subset construction) whose edges are byte ranges, whole tokens (`<[id]>`, `!<[id]>`) and calls
// of other rules (with the node to return to). A matcher state is a set of stacks of nodes: the
// top is the position in the current rule, the frames below are the return positions of the
// callers (matcher.h). Because each rule is deterministic, alternatives with common prefixes
// share one stack; only calls fork.
//
// Compilation also checks the grammar: left recursion (a rule that can reach itself without
// consuming input) is an error naming the rule, rules that can never finish are removed (an
// error when that leaves the root with nothing), every node that remains can reach the end of
// its rule, and the sizes (Limits) and the work (the compile budget, budget.h) are bounded: so a
// matcher never walks into a dead end and a request cannot make the compiler run away.
#pragma once

#include <bitset>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/budget.h"
#include "grammar/ir.h"

namespace deltafin::grammar {

// The sizes a compile may reach; the work it may do (steps, and the clock behind them) is the
// compile budget's (budget.h), which Pda::compile charges: the caller's if one is open on this
// thread, else a default one.
struct Limits {
  size_t max_nfa_states = 400'000;  // per rule, while it is built
  size_t max_nodes = 200'000;       // DFA nodes of the whole grammar
};

class Pda {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct ByteEdge {
    uint8_t lo, hi;
    uint32_t to;
  };
  struct TokenEdge {
    int32_t token;
    bool negated;
    uint32_t to;
  };
  struct CallEdge {
    uint32_t rule;
    uint32_t ret;
  };
  struct Node {
    uint32_t rule = 0;
    uint32_t bytes_begin = 0, bytes_end = 0;
    uint32_t tokens_begin = 0, tokens_end = 0;
    uint32_t calls_begin = 0, calls_end = 0;
    bool final = false;     // the rule may end here
    bool tail = false;      // final with no edges: a call returning here need not be pushed
    bool terminal = false;  // has byte or token edges (a stack may rest here)
  };

  const Node& node(uint32_t n) const { return nodes_[n]; }
  size_t size() const { return nodes_.size(); }
  uint32_t rule_start(uint32_t rule) const { return rule_start_[rule]; }
  uint32_t root_start() const { return rule_start_[root_]; }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }

  std::span<const ByteEdge> bytes(uint32_t n) const {
    return {byte_edges_.data() + nodes_[n].bytes_begin,
            nodes_[n].bytes_end - nodes_[n].bytes_begin};
  }
  std::span<const TokenEdge> tokens(uint32_t n) const {
    return {token_edges_.data() + nodes_[n].tokens_begin,
            nodes_[n].tokens_end - nodes_[n].tokens_begin};
  }
  std::span<const CallEdge> calls(uint32_t n) const {
    return {call_edges_.data() + nodes_[n].calls_begin,
            nodes_[n].calls_end - nodes_[n].calls_begin};
  }
  // The node reached from n by byte b, or kNone (each rule is deterministic).
  uint32_t step(uint32_t n, uint8_t b) const {
    for (const ByteEdge& e : bytes(n)) {
      if (b < e.lo) return kNone;
      if (b <= e.hi) return e.to;
    }
    return kNone;
  }

  // The bytes that can come right after `rule` ends, in any context it is called from (empty
  // for a rule after which only a whole token or the end of the grammar can follow).
  const std::bitset<256>& follow(uint32_t rule) const { return follow_[rule]; }

  // Compiles `g` (its rules reachable from the root). Throws InvalidArgument naming the rule for
  // left recursion, a grammar that can never finish, or a size limit; BudgetExceeded (an
  // InvalidArgument) when the work passes the compile budget, CompileCancelled when the budget's
  // caller cancels.
  static Pda compile(const Grammar& g, const Limits& limits = {});

 private:
  friend class PdaBuilder;
  std::vector<Node> nodes_;
  std::vector<ByteEdge> byte_edges_;
  std::vector<TokenEdge> token_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<uint32_t> rule_start_;  // kNone for rules not in the automaton
  std::vector<std::bitset<256>> follow_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

// The UTF-8 encodings of the scalar values in [lo, hi] as sequences of byte ranges (each
// sequence one to four ranges long), the standard split so that a prefix of an encoding is
// accepted only if some member starts with it.
std::vector<std::vector<ByteRange>> utf8_sequences(char32_t lo, char32_t hi);

}  // namespace deltafin::grammar
