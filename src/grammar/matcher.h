// Which tokens a grammar allows next, per sequence, fast enough to run every token.
//
// CompiledGrammar is a Pda for one vocabulary plus, per automaton node, the part of the token
// mask that does not depend on the stack below it (computed once per node, on first use, and
// kept for the grammar's life, which the vocabulary's cache extends across requests):
//  * accepted: tokens whose bytes can be consumed starting at this node without returning from
//    its rule, or that end exactly where the rule ends (allowed whatever called the rule);
//  * uncertain: tokens that only get through by returning from the rule into the caller, each
//    recorded with what remains of it at the return (its "rest": `,` of a token `",` that closes
//    a string). The matcher checks each distinct rest once against the real caller.
// Everything else is rejected at that node. The computation walks the vocabulary's token trie
// from the node, skipping every subtree whose prefix is already rejected, over a memo of sets
// of stacks (a lazily built DFA), so shared prefixes and repeated states cost one table lookup.
//
// Matcher is one sequence's position: a set of stacks (stacks.h). Its mask is the union of
// the accepted sets of the distinct top nodes, plus the uncertain tokens whose rest the caller
// of their stack's top rule accepts, plus the stop tokens when the grammar may end here. Stop
// tokens (the model's end-of-turn ids) are allowed only there, unless a token element of the
// grammar names one at the current position (the K3 turn grammar ends with `<|end_of_msg|>`).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "grammar/pda.h"
#include "grammar/stacks.h"
#include "grammar/vocab.h"

namespace deltafin::grammar {

// One bit per token id.
class TokenMask {
 public:
  void reset(int32_t n);  // n bits, all clear
  void fill(int32_t n);   // n bits, all set
  void set(int32_t id) { words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
  void clear(int32_t id) { words_[static_cast<size_t>(id) >> 6] &= ~(uint64_t{1} << (id & 63)); }
  bool test(int32_t id) const { return (words_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
  int32_t size() const { return n_; }
  int64_t count() const;
  std::span<uint64_t> words() { return words_; }
  std::span<const uint64_t> words() const { return words_; }

 private:
  std::vector<uint64_t> words_;
  int32_t n_ = 0;
};

inline constexpr uint32_t kMaxStackDepth = 1024;

class CompiledGrammar {
 public:
  struct NodeInfo {
    std::vector<int32_t> accepted;  // when `dense` is empty
    std::vector<uint64_t> dense;    // accepted, as bits, when that is smaller
    // Uncertain tokens, grouped by what is left of them after the rule returns ("rests", in
    // byte order, each with the bytes it shares with the one before): a rest that the caller's
    // position can consume admits its tokens.
    std::vector<std::string> rests;
    std::vector<uint16_t> lcp;
    std::vector<uint32_t> rest_begin;  // rests.size() + 1 offsets into rest_tokens
    std::vector<int32_t> rest_tokens;
    size_t bytes() const;
  };

  // Owns `vocab` (kept alive with the grammar).
  CompiledGrammar(Pda pda, std::shared_ptr<const TokenVocab> vocab);
  // Does not own `vocab`: for the vocabulary's own cache of grammars, which would otherwise
  // form an ownership cycle (a vocabulary holding a grammar holding the vocabulary) that is
  // never freed. The handles compile_*() return own both (constraint.cpp).
  CompiledGrammar(Pda pda, const TokenVocab& vocab);
  ~CompiledGrammar();

  const Pda& pda() const { return pda_; }
  const TokenVocab& vocab() const { return *vocab_; }
  // The node's context-independent mask (computed on first use; thread-safe).
  const NodeInfo& info(uint32_t node) const;
  // Whether the node's info is computed already (then info() is a lookup).
  bool computed(uint32_t node) const {
    return infos_[node].load(std::memory_order_acquire) != nullptr;
  }
  // Computes every node's info now (benchmarks; servers may warm a grammar).
  void precompute() const;
  size_t nodes_computed() const;

 private:
  struct Memo;
  NodeInfo compute(uint32_t node) const;

  Pda pda_;
  std::shared_ptr<const TokenVocab> owner_;  // null when not owning
  const TokenVocab* vocab_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<Memo> memo_;
  mutable std::vector<std::unique_ptr<NodeInfo>> owned_;
  std::unique_ptr<std::atomic<const NodeInfo*>[]> infos_;
};

// Nodes of a grammar whose infos are not computed yet: the cold part of the masks to come, which
// compute() fills in (thread-safe, so on another thread while a forward pass runs).
struct ColdNodes {
  const CompiledGrammar* grammar = nullptr;
  std::vector<uint32_t> nodes;
  void compute() const {
    for (const uint32_t n : nodes) grammar->info(n);
  }
};

// A lazy grammar's trigger: the constraint starts once the generated output ends with these
// symbols (bytes 0..255, or kTokenSymbol + id for a whole token such as a special marker); the
// grammar then matches what follows.
inline constexpr int32_t kTokenSymbol = 256;

class Matcher {
 public:
  Matcher(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> stop_ids,
          std::vector<int32_t> trigger = {});

  // The tokens allowed next into `mask` (resized to the vocabulary).
  void fill_mask(TokenMask& mask);
  // Whether `token` is allowed next (one token; for cutting drafts).
  bool allows(int32_t token);
  // Advances by `token`; false, with the state unchanged, when it is not allowed.
  bool accept(int32_t token);
  // The nodes the masks at this position and after each of `then` in turn (up to the first
  // token refused) will ask for and that are not computed yet; a copy is advanced, this
  // matcher is untouched. Advancing never computes an info, so this costs stack steps only.
  ColdNodes cold_nodes(std::span<const int32_t> then) const;

  bool active() const { return active_; }  // false while a lazy grammar awaits its trigger
  bool complete() const { return !active_ || complete_; }  // stop tokens allowed
  bool finished() const { return finished_; }              // a stop token was accepted
  // Nothing but a stop token can follow (the grammar has ended).
  bool at_end() const { return active_ && tops_.empty(); }
  bool depth_limited() const { return stepper_.overflow; }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  void reset_to_root();
  bool is_stop(int32_t t) const;
  bool explicit_token(int32_t t) const;  // a positive token edge at a top names t
  // Steps `tops` by `token` into out; returns whether the token is consumed (out non-empty or
  // a path ended exactly at its end).
  bool advance(std::span<const int32_t> tops, int32_t token, std::vector<int32_t>& out, bool& ended,
               bool scratch);
  void check_rests(int32_t stack, const CompiledGrammar::NodeInfo& info, TokenMask& mask);
  void compact();

  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> trigger_;
  std::vector<int32_t> recent_;  // the last symbols while awaiting the trigger
  StackArena arena_{true};
  Stepper stepper_;
  std::vector<int32_t> tops_;
  bool complete_ = false, active_ = true, finished_ = false;
  std::vector<std::vector<int32_t>> levels_;
  std::vector<char> level_ended_;
  std::vector<int32_t> tmp_, tmp2_;
};

}  // namespace deltafin::grammar
