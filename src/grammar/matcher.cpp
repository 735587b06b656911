#include "grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/error.h"

namespace deltafin::grammar {

void TokenMask::reset(int32_t n) {
  n_ = n;
  words_.assign((static_cast<size_t>(n) + 63) / 64, 0);
}

void TokenMask::fill(int32_t n) {
  n_ = n;
  words_.assign((static_cast<size_t>(n) + 63) / 64, ~uint64_t{0});
  if (n % 64 != 0) words_.back() = (uint64_t{1} << (n % 64)) - 1;
}

int64_t TokenMask::count() const {
  int64_t c = 0;
  for (uint64_t w : words_) c += std::popcount(w);
  return c;
}

size_t CompiledGrammar::NodeInfo::bytes() const {
  size_t n = accepted.size() * 4 + dense.size() * 8 + rest_tokens.size() * 4 + lcp.size() * 6;
  for (const auto& r : rests) n += r.size() + sizeof(std::string);
  return n;
}

// The precomputation's memo: sets of stacks ("configs") over a hash-consed arena whose bottom
// stands for "the rule under study returned", and their byte transitions.
struct CompiledGrammar::Memo {
  static constexpr size_t kDenseConfigs = 8192;  // configs with a transition table (8 MiB)

  struct Config {
    std::vector<int32_t> frames;
    bool ended;
  };

  explicit Memo(const Pda& p) : stepper(p, kMaxStackDepth) { intern({}, false); }

  int32_t intern(std::vector<int32_t> frames, bool ended) {
    std::sort(frames.begin(), frames.end());
    frames.erase(std::unique(frames.begin(), frames.end()), frames.end());
    key.assign(frames.size() * 4 + 1, '\0');
    if (!frames.empty()) std::memcpy(key.data(), frames.data(), frames.size() * 4);
    key.back() = ended ? 1 : 0;
    auto [it, added] = ids.emplace(key, static_cast<int32_t>(configs.size()));
    if (added) {
      configs.push_back({std::move(frames), ended});
      if (configs.size() <= kDenseConfigs) trans.resize(configs.size() * 256, -1);
    }
    return it->second;
  }

  int32_t next(int32_t c, uint8_t b) {
    const bool dense = static_cast<size_t>(c) < kDenseConfigs;
    if (dense) {
      const int32_t t = trans[static_cast<size_t>(c) * 256 + b];
      if (t >= 0) return t;
    }
    out.clear();
    stepper.step_byte(arena, configs[static_cast<size_t>(c)].frames, b, out, false);
    const int32_t t = intern(out, stepper.ended);
    if (dense) trans[static_cast<size_t>(c) * 256 + b] = t;
    return t;
  }

  StackArena arena{true};
  Stepper stepper;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<Config> configs;
  std::vector<int32_t> trans;
  std::vector<int32_t> out;
  std::string key;
};

CompiledGrammar::CompiledGrammar(Pda pda, std::shared_ptr<const TokenVocab> vocab)
    : CompiledGrammar(std::move(pda), *vocab) {
  owner_ = std::move(vocab);
}

CompiledGrammar::CompiledGrammar(Pda pda, const TokenVocab& vocab)
    : pda_(std::move(pda)), vocab_(&vocab), infos_(new std::atomic<const NodeInfo*>[pda_.size()]) {
  for (size_t i = 0; i < pda_.size(); ++i) infos_[i].store(nullptr, std::memory_order_relaxed);
  for (size_t i = 0; i < pda_.size(); ++i) {
    for (const auto& e : pda_.tokens(static_cast<uint32_t>(i))) {
      if (e.token < 0 || e.token >= vocab_->size())
        fail_arg("grammar: token id {} is outside the vocabulary of {}", e.token, vocab_->size());
    }
  }
}

CompiledGrammar::~CompiledGrammar() = default;

const CompiledGrammar::NodeInfo& CompiledGrammar::info(uint32_t node) const {
  if (const NodeInfo* p = infos_[node].load(std::memory_order_acquire)) return *p;
  std::lock_guard lock(mu_);
  if (const NodeInfo* p = infos_[node].load(std::memory_order_relaxed)) return *p;
  owned_.push_back(std::make_unique<NodeInfo>(compute(node)));
  infos_[node].store(owned_.back().get(), std::memory_order_release);
  return *owned_.back();
}

void CompiledGrammar::precompute() const {
  for (uint32_t n = 0; n < pda_.size(); ++n) {
    if (pda_.node(n).terminal) info(n);
  }
}

size_t CompiledGrammar::nodes_computed() const {
  std::lock_guard lock(mu_);
  return owned_.size();
}

CompiledGrammar::NodeInfo CompiledGrammar::compute(uint32_t n) const {
  if (!memo_ || memo_->configs.size() > Memo::kDenseConfigs) memo_ = std::make_unique<Memo>(pda_);
  Memo& m = *memo_;
  const TokenVocab& v = *vocab_;
  const auto& trie = v.trie();
  const auto& ttok = v.trie_tokens();
  NodeInfo info;
  std::vector<int32_t> accepted;
  bool negated_edge = false;
  int32_t negated_token = -1;
  for (const auto& e : pda_.tokens(n)) {
    if (e.negated) {
      // Any token but one: only one negated edge per node can be represented this way; more
      // than one is the union "all tokens" (each excludes a different one).
      negated_token = negated_edge && negated_token != e.token ? -1 : e.token;
      negated_edge = true;
    } else {
      accepted.push_back(e.token);
    }
  }

  // Walk the trie. `splits` holds the depths on the current path at which a path returned from
  // the rule (popped the bottom frame); a token that dies after one is uncertain, with one rest
  // per split.
  const size_t levels = v.max_token_bytes() + 2;
  std::vector<int32_t> cfg(levels, 0);
  std::vector<size_t> splits;
  std::map<std::string, std::vector<int32_t>> rests;
  cfg[0] = m.intern({m.arena.push(n, -1)}, false);
  // A rest whose first byte can never follow the rule is rejected here already.
  const std::bitset<256>& follow = pda_.follow(pda_.node(n).rule);
  auto uncertain = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) {
      const int32_t id = ttok[k];
      const std::string_view b = v.bytes(id);
      for (const size_t sp : splits) {
        if (follow.test(static_cast<uint8_t>(b[sp])))
          rests[std::string(b.substr(sp))].push_back(id);
      }
    }
  };
  for (size_t i = 0; i < trie.size();) {
    const TokenVocab::TrieNode& t = trie[i];
    const size_t d = t.depth;
    while (!splits.empty() && splits.back() >= d) splits.pop_back();
    const int32_t c = m.next(cfg[d - 1], t.byte);
    const auto& conf = m.configs[static_cast<size_t>(c)];
    const bool alive = !conf.frames.empty(), here = conf.ended;
    if (alive || here) {
      accepted.insert(accepted.end(), ttok.begin() + t.tokens_begin, ttok.begin() + t.tokens_end);
    } else {
      uncertain(t.tokens_begin, t.tokens_end);
    }
    if (here) splits.push_back(d);
    if (alive) {
      cfg[d] = c;
      ++i;
      continue;
    }
    if (!splits.empty()) {
      const size_t end = t.skip < trie.size() ? trie[t.skip].tokens_begin : ttok.size();
      uncertain(t.tokens_end, end);
    }
    i = t.skip;
  }
  info.rest_begin.push_back(0);
  info.rests.reserve(rests.size());
  std::string_view prev;
  for (auto& [rest, ids] : rests) {
    size_t l = 0;
    while (l < prev.size() && l < rest.size() && prev[l] == rest[l]) ++l;
    info.lcp.push_back(static_cast<uint16_t>(l));
    info.rests.push_back(rest);
    prev = info.rests.back();
    info.rest_tokens.insert(info.rest_tokens.end(), ids.begin(), ids.end());
    info.rest_begin.push_back(static_cast<uint32_t>(info.rest_tokens.size()));
  }
  const int32_t vocab = v.size();
  if (negated_edge || static_cast<int64_t>(accepted.size()) * 32 > vocab) {
    TokenMask bits;
    if (negated_edge) {
      bits.fill(vocab);
      if (negated_token >= 0) bits.clear(negated_token);
    } else {
      bits.reset(vocab);
    }
    for (int32_t id : accepted) bits.set(id);
    info.dense.assign(bits.words().begin(), bits.words().end());
  } else {
    std::sort(accepted.begin(), accepted.end());
    accepted.erase(std::unique(accepted.begin(), accepted.end()), accepted.end());
    info.accepted = std::move(accepted);
  }
  return info;
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> stop_ids,
                 std::vector<int32_t> trigger)
    : g_(std::move(g)),
      stop_ids_(std::move(stop_ids)),
      trigger_(std::move(trigger)),
      stepper_(g_->pda(), kMaxStackDepth) {
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  for (int32_t s : stop_ids_) {
    if (s < 0 || s >= g_->vocab().size()) fail_arg("grammar: stop id {} outside the vocabulary", s);
  }
  levels_.resize(g_->vocab().max_token_bytes() + 2);
  level_ended_.resize(levels_.size());
  active_ = trigger_.empty();
  if (active_) reset_to_root();
}

void Matcher::reset_to_root() {
  arena_.clear();
  tops_.clear();
  stepper_.begin_round();
  stepper_.ended = false;
  stepper_.close(arena_, arena_.push(g_->pda().root_start(), -1), tops_, false);
  std::sort(tops_.begin(), tops_.end());
  complete_ = stepper_.ended;
}

bool Matcher::is_stop(int32_t t) const {
  return std::binary_search(stop_ids_.begin(), stop_ids_.end(), t);
}

bool Matcher::explicit_token(int32_t t) const {
  for (const int32_t y : tops_) {
    for (const auto& e : g_->pda().tokens(arena_[y].node)) {
      if (!e.negated && e.token == t) return true;
    }
  }
  return false;
}

bool Matcher::advance(std::span<const int32_t> tops, int32_t token, std::vector<int32_t>& out,
                      bool& ended, bool scratch) {
  out.clear();
  stepper_.step_token(arena_, tops, token, out, scratch);
  ended = stepper_.ended;
  const TokenVocab& v = g_->vocab();
  if (!v.is_special(token)) {
    const std::string_view bytes = v.bytes(token);
    tmp_.assign(tops.begin(), tops.end());
    bool ok = !bytes.empty();
    for (size_t i = 0; i < bytes.size() && ok; ++i) {
      tmp2_.clear();
      stepper_.step_byte(arena_, tmp_, static_cast<uint8_t>(bytes[i]), tmp2_, scratch);
      if (i + 1 == bytes.size()) ended = ended || stepper_.ended;
      tmp_.swap(tmp2_);
      ok = !tmp_.empty();
    }
    out.insert(out.end(), tmp_.begin(), tmp_.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return !out.empty() || ended;
}

bool Matcher::allows(int32_t token) {
  if (finished_ || token < 0 || token >= g_->vocab().size()) return false;
  if (!active_) return true;
  if (is_stop(token) && !explicit_token(token)) return complete_;
  const size_t mark = arena_.size();
  std::vector<int32_t> out;
  bool ended = false;
  const bool ok = advance(tops_, token, out, ended, true);
  arena_.truncate(mark);
  return ok;
}

bool Matcher::accept(int32_t token) {
  if (finished_ || token < 0 || token >= g_->vocab().size()) return false;
  if (!active_) {
    if (is_stop(token)) {
      finished_ = true;
      return true;
    }
    if (g_->vocab().is_special(token)) {
      recent_.push_back(kTokenSymbol + token);
    } else {
      for (const char c : g_->vocab().bytes(token)) recent_.push_back(static_cast<uint8_t>(c));
    }
    if (recent_.size() > trigger_.size())
      recent_.erase(recent_.begin(), recent_.end() - static_cast<ptrdiff_t>(trigger_.size()));
    if (recent_ == trigger_) {
      active_ = true;
      recent_.clear();
      reset_to_root();
    }
    return true;
  }
  if (is_stop(token) && !explicit_token(token)) {
    if (!complete_) return false;
    finished_ = true;
    return true;
  }
  std::vector<int32_t> out;
  bool ended = false;
  stepper_.overflow = false;
  if (!advance(tops_, token, out, ended, false)) return false;
  tops_ = std::move(out);
  complete_ = ended;
  compact();
  return true;
}

ColdNodes Matcher::cold_nodes(std::span<const int32_t> then) const {
  ColdNodes out;
  out.grammar = g_.get();
  Matcher m = *this;
  auto collect = [&] {
    if (!m.active_ || m.finished_) return;
    for (const int32_t y : m.tops_) {
      const uint32_t node = m.arena_[y].node;
      if (!g_->computed(node) &&
          std::find(out.nodes.begin(), out.nodes.end(), node) == out.nodes.end())
        out.nodes.push_back(node);
    }
  };
  collect();
  for (const int32_t t : then) {
    if (!m.accept(t)) break;
    collect();
  }
  return out;
}

void Matcher::compact() {
  size_t live = 0;
  for (const int32_t y : tops_) live += arena_[y].depth;
  if (arena_.size() < 4096 || arena_.size() < 8 * live) return;
  StackArena fresh(true);
  for (int32_t& y : tops_) {
    int32_t x = -1;
    for (const uint32_t node : arena_.nodes(y)) x = fresh.push(node, x);
    y = x;
  }
  arena_ = std::move(fresh);
  std::sort(tops_.begin(), tops_.end());
}

void Matcher::check_rests(int32_t stack, const CompiledGrammar::NodeInfo& info, TokenMask& mask) {
  // The rests continue in the caller: the stack with its top frame popped. At the bottom there
  // is no caller (the grammar would have ended) and a rest, never empty, has nowhere to go.
  const int32_t parent = arena_[stack].parent;
  if (parent < 0) return;
  levels_[0].clear();
  stepper_.begin_round();
  stepper_.close(arena_, parent, levels_[0], true);
  level_ended_[0] = 0;
  constexpr size_t kNone = SIZE_MAX;
  size_t valid = 0;       // levels[0..valid] hold the last computed rest's prefix, alive
  size_t dead = kNone;    // levels[dead] is empty for that prefix
  size_t common = kNone;  // bytes shared with the last computed rest
  for (size_t j = 0; j < info.rests.size(); ++j) {
    common = std::min<size_t>(common, info.lcp[j]);
    const std::string_view bytes = info.rests[j];
    bool ok = false;
    if (dead != kNone && dead <= common) {
      // Shares a prefix already rejected; only a rest that ends exactly where a path ended
      // the grammar gets through.
      ok = bytes.size() == dead && level_ended_[dead];
    } else {
      size_t d = std::min(valid, common);
      bool died = false;
      for (; d < bytes.size(); ++d) {
        auto& next = levels_[d + 1];
        next.clear();
        stepper_.step_byte(arena_, levels_[d], static_cast<uint8_t>(bytes[d]), next, true);
        level_ended_[d + 1] = stepper_.ended ? 1 : 0;
        if (next.empty()) {
          died = true;
          break;
        }
      }
      if (died) {
        valid = d;
        dead = d + 1;
        ok = dead == bytes.size() && level_ended_[dead];
      } else {
        valid = bytes.size();
        dead = kNone;
        ok = true;
      }
      common = kNone;
    }
    if (ok) {
      for (uint32_t k = info.rest_begin[j]; k < info.rest_begin[j + 1]; ++k)
        mask.set(info.rest_tokens[k]);
    }
  }
}

void Matcher::fill_mask(TokenMask& mask) {
  const int32_t n = g_->vocab().size();
  if (finished_) {
    mask.reset(n);
    return;
  }
  if (!active_) {
    mask.fill(n);
    return;
  }
  mask.reset(n);
  const size_t mark = arena_.size();
  auto words = mask.words();
  uint32_t last = Pda::kNone;
  std::vector<uint32_t> seen;
  for (const int32_t y : tops_) {
    const uint32_t node = arena_[y].node;
    if (node == last || std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
    seen.push_back(node);
    last = node;
    const auto& info = g_->info(node);
    if (!info.dense.empty()) {
      for (size_t w = 0; w < words.size(); ++w) words[w] |= info.dense[w];
    } else {
      for (const int32_t id : info.accepted) mask.set(id);
    }
  }
  for (const int32_t y : tops_) {
    const auto& info = g_->info(arena_[y].node);
    if (!info.rests.empty()) check_rests(y, info, mask);
  }
  arena_.truncate(mark);
  for (const int32_t s : stop_ids_) {
    if (complete_ || explicit_token(s)) {
      mask.set(s);
    } else {
      mask.clear(s);
    }
  }
}

}  // namespace deltafin::grammar
