// Grammar to pushdown automaton (see pda.h). Every loop here whose length depends on the grammar
// charges what it does to the compile budget (budget.h): states and edges built, subsets visited
// and interned, product pairs, and the passes of the checks after.
#include "grammar/pda.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace deltafin::grammar {

std::vector<std::vector<ByteRange>> utf8_sequences(char32_t lo, char32_t hi) {
  std::vector<std::vector<ByteRange>> out;
  struct Work {
    char32_t lo, hi;
  };
  std::vector<Work> todo{{lo, hi}};
  auto len = [](char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; };
  auto encode = [](char32_t c, uint8_t* b) {
    if (c < 0x80) {
      b[0] = static_cast<uint8_t>(c);
    } else if (c < 0x800) {
      b[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      b[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    } else {
      b[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    }
  };
  while (!todo.empty()) {
    const Work w = todo.back();
    todo.pop_back();
    if (w.lo > w.hi) continue;
    // Split where the encoded length changes.
    bool split = false;
    for (char32_t edge : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
      if (w.lo <= edge && w.hi > edge) {
        todo.push_back({edge + 1, w.hi});
        todo.push_back({w.lo, edge});
        split = true;
        break;
      }
    }
    if (split) continue;
    const int n = len(w.lo);
    for (int i = 1; i < n && !split; ++i) {
      const char32_t m = (char32_t{1} << (6 * i)) - 1;
      if ((w.lo & ~m) != (w.hi & ~m)) {
        if ((w.lo & m) != 0) {
          todo.push_back({(w.lo | m) + 1, w.hi});
          todo.push_back({w.lo, w.lo | m});
          split = true;
        } else if ((w.hi & m) != m) {
          todo.push_back({w.hi & ~m, w.hi});
          todo.push_back({w.lo, (w.hi & ~m) - 1});
          split = true;
        }
      }
    }
    if (split) continue;
    uint8_t a[4], b[4];
    encode(w.lo, a);
    encode(w.hi, b);
    std::vector<ByteRange> s;
    for (int i = 0; i < n; ++i) s.push_back({a[i], b[i]});
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

enum class Label : uint8_t { byte, token, call };

struct NfaEdge {
  Label label;
  uint8_t lo, hi;
  bool negated;
  int32_t value;  // token id or rule
  uint32_t to;
};

// A Thompson NFA for one rule (or one operand of an intersection).
struct Nfa {
  std::vector<std::vector<uint32_t>> eps;
  std::vector<std::vector<NfaEdge>> edges;
  size_t limit = 0;
  const std::string* rule_name = nullptr;
  CompileBudget* budget = nullptr;

  uint32_t add() {
    budget->spend(1);
    if (eps.size() >= limit)
      fail_arg("grammar: rule `{}` is too large (more than {} automaton states)", *rule_name,
               limit);
    eps.emplace_back();
    edges.emplace_back();
    return static_cast<uint32_t>(eps.size() - 1);
  }
};

struct Frag {
  uint32_t start, end;
};

// A DFA over bytes only (what intersections are computed on).
struct ByteDfa {
  struct State {
    std::vector<Pda::ByteEdge> edges;  // sorted, disjoint
    bool final = false;
  };
  std::vector<State> states;  // 0 is the start
};

// A DFA node before trimming and renumbering.
struct DNode {
  uint32_t rule = 0;
  bool final = false;
  std::vector<Pda::ByteEdge> bytes;
  std::vector<Pda::TokenEdge> tokens;
  std::vector<Pda::CallEdge> calls;
};

}  // namespace

class PdaBuilder {
 public:
  PdaBuilder(const Grammar& g, const Limits& limits, CompileBudget& budget)
      : g_(g), limits_(limits), budget_(budget) {}

  Pda run();

 private:
  std::vector<char> reachable_rules();
  std::vector<uint32_t> build_rules(const std::vector<char>& used);
  std::vector<char> prune_dead(const std::vector<char>& used, const std::vector<uint32_t>& start);
  std::vector<char> refuse_left_recursion(const std::vector<char>& productive,
                                          const std::vector<uint32_t>& start);
  Pda renumber(const std::vector<uint32_t>& start);
  void first_and_follow(Pda& p, const std::vector<char>& nullable);
  Frag build(Nfa& nfa, const ExprPtr& e);
  Frag build_repeat(Nfa& nfa, const ExprPtr& x, uint32_t min, uint32_t max);
  ByteDfa byte_dfa(const ExprPtr& e);
  Frag embed(Nfa& nfa, const ByteDfa& d);
  // Subset construction of `nfa` from `start` (accepting `accept`): appends to nodes_ (rule
  // `rule`) and returns the start node; with `byte_only` into `out` instead.
  uint32_t determinize(const Nfa& nfa, uint32_t start, uint32_t accept, uint32_t rule,
                       ByteDfa* out);

  const Grammar& g_;
  Limits limits_;
  CompileBudget& budget_;
  int byte_dfa_depth_ = 0;  // intersection operands being built, one inside another
  std::vector<DNode> nodes_;
};

Frag PdaBuilder::build(Nfa& nfa, const ExprPtr& e) {
  switch (e->kind) {
    case ExprKind::empty: {
      const uint32_t s = nfa.add();
      return {s, s};
    }
    case ExprKind::nothing:
      return {nfa.add(), nfa.add()};
    case ExprKind::bytes: {
      const uint32_t s = nfa.add();
      uint32_t cur = s;
      for (const char c : e->bytes) {
        const uint32_t nx = nfa.add();
        const auto b = static_cast<uint8_t>(c);
        nfa.edges[cur].push_back({Label::byte, b, b, false, 0, nx});
        cur = nx;
      }
      return {s, cur};
    }
    case ExprKind::byte_class: {
      const uint32_t s = nfa.add(), t = nfa.add();
      for (const ByteRange& r : e->byte_ranges)
        nfa.edges[s].push_back({Label::byte, r.lo, r.hi, false, 0, t});
      return {s, t};
    }
    case ExprKind::char_class: {
      const uint32_t s = nfa.add(), t = nfa.add();
      for (const CharRange& r : e->char_ranges) {
        const auto paths = utf8_sequences(r.lo, r.hi);
        budget_.spend(1 + paths.size());
        for (const auto& path : paths) {
          uint32_t cur = s;
          for (size_t i = 0; i < path.size(); ++i) {
            const uint32_t nx = i + 1 == path.size() ? t : nfa.add();
            nfa.edges[cur].push_back({Label::byte, path[i].lo, path[i].hi, false, 0, nx});
            cur = nx;
          }
        }
      }
      return {s, t};
    }
    case ExprKind::seq: {
      Frag f = build(nfa, e->items[0]);
      for (size_t i = 1; i < e->items.size(); ++i) {
        const Frag n = build(nfa, e->items[i]);
        nfa.eps[f.end].push_back(n.start);
        f.end = n.end;
      }
      return f;
    }
    case ExprKind::alt: {
      const uint32_t s = nfa.add(), t = nfa.add();
      for (const auto& it : e->items) {
        const Frag f = build(nfa, it);
        nfa.eps[s].push_back(f.start);
        nfa.eps[f.end].push_back(t);
      }
      return {s, t};
    }
    case ExprKind::repeat:
      return build_repeat(nfa, e->items[0], e->min, e->max);
    case ExprKind::ref: {
      const uint32_t s = nfa.add(), t = nfa.add();
      nfa.edges[s].push_back({Label::call, 0, 0, false, static_cast<int32_t>(e->rule), t});
      return {s, t};
    }
    case ExprKind::token: {
      const uint32_t s = nfa.add(), t = nfa.add();
      nfa.edges[s].push_back({Label::token, 0, 0, e->negated, e->token, t});
      return {s, t};
    }
    case ExprKind::intersect: {
      const ByteDfa a = byte_dfa(e->items[0]);
      const ByteDfa b = byte_dfa(e->items[1]);
      // Product automaton, breadth first from (0, 0).
      ByteDfa p;
      std::map<std::pair<uint32_t, uint32_t>, uint32_t> ids;
      std::vector<std::pair<uint32_t, uint32_t>> todo{{0, 0}};
      ids[{0, 0}] = 0;
      p.states.emplace_back();
      for (size_t i = 0; i < todo.size(); ++i) {
        if (p.states.size() > limits_.max_nfa_states)
          fail_arg("grammar: an intersection is too large (more than {} states)",
                   limits_.max_nfa_states);
        const auto [x, y] = todo[i];
        budget_.spend(1 + a.states[x].edges.size() * b.states[y].edges.size());
        p.states[i].final = a.states[x].final && b.states[y].final;
        for (const auto& ea : a.states[x].edges) {
          for (const auto& eb : b.states[y].edges) {
            const uint8_t lo = std::max(ea.lo, eb.lo), hi = std::min(ea.hi, eb.hi);
            if (lo > hi) continue;
            const auto key = std::make_pair(ea.to, eb.to);
            auto [it, added] = ids.emplace(key, static_cast<uint32_t>(p.states.size()));
            if (added) {
              p.states.emplace_back();
              todo.push_back(key);
            }
            p.states[i].edges.push_back({lo, hi, it->second});
          }
        }
      }
      return embed(nfa, p);
    }
  }
  fail("grammar: unknown expression kind");
}

Frag PdaBuilder::build_repeat(Nfa& nfa, const ExprPtr& x, uint32_t min, uint32_t max) {
  const uint32_t s = nfa.add();
  uint32_t cur = s;
  for (uint32_t i = 0; i < min; ++i) {
    const Frag f = build(nfa, x);
    nfa.eps[cur].push_back(f.start);
    cur = f.end;
  }
  if (max == kUnbounded) {
    const uint32_t loop = nfa.add();
    nfa.eps[cur].push_back(loop);
    const Frag f = build(nfa, x);
    nfa.eps[loop].push_back(f.start);
    nfa.eps[f.end].push_back(loop);
    return {s, loop};
  }
  const uint32_t t = nfa.add();
  nfa.eps[cur].push_back(t);
  for (uint32_t i = min; i < max; ++i) {
    const Frag f = build(nfa, x);
    nfa.eps[cur].push_back(f.start);
    nfa.eps[f.end].push_back(t);
    cur = f.end;
  }
  return {s, t};
}

ByteDfa PdaBuilder::byte_dfa(const ExprPtr& e) {
  // An operand inside another intersection's operand was checked with it: checking each nested
  // one again would cost the square of their number.
  if (byte_dfa_depth_ == 0) {
    uint64_t visited = 0;
    const bool regular = is_regular(e, &visited);
    budget_.spend(visited);
    if (!regular)
      fail_arg("grammar: an intersection operand must be regular (no rule references or tokens)");
  }
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(++x) {}
    ~Depth() { --d; }
  } depth(byte_dfa_depth_);
  Nfa nfa;
  nfa.limit = limits_.max_nfa_states;
  static const std::string kName = "(intersection)";
  nfa.rule_name = &kName;
  nfa.budget = &budget_;
  const Frag f = build(nfa, e);
  ByteDfa out;
  determinize(nfa, f.start, f.end, 0, &out);
  return out;
}

Frag PdaBuilder::embed(Nfa& nfa, const ByteDfa& d) {
  const uint32_t base = static_cast<uint32_t>(nfa.eps.size());
  for (size_t i = 0; i < d.states.size(); ++i) nfa.add();
  const uint32_t t = nfa.add();
  for (size_t i = 0; i < d.states.size(); ++i) {
    budget_.spend(d.states[i].edges.size());
    for (const auto& e : d.states[i].edges)
      nfa.edges[base + i].push_back({Label::byte, e.lo, e.hi, false, 0, base + e.to});
    if (d.states[i].final) nfa.eps[base + i].push_back(t);
  }
  return {base, t};
}

uint32_t PdaBuilder::determinize(const Nfa& nfa, uint32_t start, uint32_t accept, uint32_t rule,
                                 ByteDfa* out) {
  budget_.spend(nfa.eps.size());
  std::vector<uint32_t> mark(nfa.eps.size(), 0);
  uint32_t epoch = 0;
  std::vector<uint32_t> work;
  // Each subset costs its closure (states popped), its sort and its lookup in `ids` (about its
  // size each): charged as 3 steps per state popped.
  auto closure = [&](std::vector<uint32_t> set) {
    ++epoch;
    work.assign(set.begin(), set.end());
    set.clear();
    uint64_t popped = 0;
    while (!work.empty()) {
      const uint32_t s = work.back();
      work.pop_back();
      ++popped;
      if (mark[s] == epoch) continue;
      mark[s] = epoch;
      set.push_back(s);
      for (uint32_t t : nfa.eps[s]) work.push_back(t);
    }
    budget_.spend(3 * popped);
    std::sort(set.begin(), set.end());
    return set;
  };
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<std::vector<uint32_t>> sets;
  const size_t base = out ? 0 : nodes_.size();
  auto intern = [&](std::vector<uint32_t> set) -> uint32_t {
    auto [it, added] = ids.emplace(std::move(set), static_cast<uint32_t>(sets.size()));
    if (added) {
      sets.push_back(it->first);
      if (out) {
        out->states.emplace_back();
        if (out->states.size() > limits_.max_nfa_states)
          fail_arg("grammar: an intersection operand is too large");
      } else {
        if (nodes_.size() >= limits_.max_nodes)
          fail_arg(
              "grammar: too large (more than {} automaton nodes); simplify it or bound its "
              "repetitions",
              limits_.max_nodes);
        nodes_.emplace_back();
        nodes_.back().rule = rule;
      }
    }
    return static_cast<uint32_t>(base + it->second);
  };
  const uint32_t first = intern(closure({start}));
  std::vector<uint16_t> cuts;
  for (size_t i = 0; i < sets.size(); ++i) {
    const std::vector<uint32_t> set = sets[i];  // copy: sets may grow
    const bool final = std::binary_search(set.begin(), set.end(), accept);
    // Byte edges: cut the byte range at every edge boundary, then group.
    cuts.clear();
    std::map<std::pair<int32_t, bool>, std::vector<uint32_t>> tok;
    std::map<uint32_t, std::vector<uint32_t>> call;
    for (uint32_t s : set) {
      for (const NfaEdge& e : nfa.edges[s]) {
        if (e.label == Label::byte) {
          cuts.push_back(e.lo);
          cuts.push_back(static_cast<uint16_t>(e.hi + 1));
        } else if (e.label == Label::token) {
          tok[{e.value, e.negated}].push_back(e.to);
        } else {
          call[static_cast<uint32_t>(e.value)].push_back(e.to);
        }
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    // The loop below scans the set's edges once per piece of the byte range.
    uint64_t edges = 0;
    for (uint32_t s : set) edges += nfa.edges[s].size();
    budget_.spend(set.size() + (cuts.size() + 1) * (set.size() + edges));
    std::vector<Pda::ByteEdge> byte_edges;
    std::vector<uint32_t> targets;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const uint16_t lo = cuts[c], hi = static_cast<uint16_t>(cuts[c + 1] - 1);
      targets.clear();
      for (uint32_t s : set) {
        for (const NfaEdge& e : nfa.edges[s]) {
          if (e.label == Label::byte && e.lo <= lo && hi <= e.hi) targets.push_back(e.to);
        }
      }
      if (targets.empty()) continue;
      const uint32_t to = intern(closure(targets));
      if (!byte_edges.empty() && byte_edges.back().to == to && byte_edges.back().hi + 1 == lo) {
        byte_edges.back().hi = static_cast<uint8_t>(hi);
      } else {
        byte_edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
      }
    }
    std::vector<Pda::TokenEdge> token_edges;
    for (auto& [k, ts] : tok) token_edges.push_back({k.first, k.second, intern(closure(ts))});
    std::vector<Pda::CallEdge> call_edges;
    for (auto& [r, ts] : call) call_edges.push_back({r, intern(closure(ts))});
    if (out) {
      out->states[i].final = final;
      out->states[i].edges = std::move(byte_edges);
    } else {
      DNode& n = nodes_[base + i];
      n.final = final;
      n.bytes = std::move(byte_edges);
      n.tokens = std::move(token_edges);
      n.calls = std::move(call_edges);
    }
  }
  return first;
}

// The rules reachable from the root (1 each); a reference to a rule never defined is refused.
std::vector<char> PdaBuilder::reachable_rules() {
  std::vector<char> used(g_.rules.size(), 0);
  std::vector<uint32_t> todo{g_.root};
  used[g_.root] = 1;
  std::vector<const Expr*> stack;
  // Rule bodies share subexpressions (a DAG): each is visited once, not once per path to it.
  std::unordered_set<const Expr*> visited;
  while (!todo.empty()) {
    const uint32_t r = todo.back();
    todo.pop_back();
    if (!g_.rules[r]) fail_arg("grammar: rule `{}` is used but never defined", g_.names[r]);
    stack.assign(1, g_.rules[r].get());
    while (!stack.empty()) {
      const Expr* e = stack.back();
      stack.pop_back();
      budget_.spend(1);
      if (!visited.insert(e).second) continue;
      if (e->kind == ExprKind::ref && !used[e->rule]) {
        used[e->rule] = 1;
        todo.push_back(e->rule);
      }
      for (const auto& it : e->items) stack.push_back(it.get());
    }
  }
  return used;
}

// Each used rule as a deterministic automaton in nodes_; its start node (kNone when unused).
std::vector<uint32_t> PdaBuilder::build_rules(const std::vector<char>& used) {
  const size_t n_rules = g_.rules.size();
  std::vector<uint32_t> start(n_rules, Pda::kNone);
  for (uint32_t r = 0; r < n_rules; ++r) {
    if (!used[r]) continue;
    Nfa nfa;
    nfa.limit = limits_.max_nfa_states;
    nfa.rule_name = &g_.names[r];
    nfa.budget = &budget_;
    try {
      const Frag f = build(nfa, g_.rules[r]);
      start[r] = determinize(nfa, f.start, f.end, r, nullptr);
    } catch (const BudgetExceeded& e) {
      throw BudgetExceeded(fmt::format("{} (it ran out in rule `{}`)", e.what(), g_.names[r]));
    }
  }
  return start;
}

// Liveness: a node is live when it can reach the end of its rule; a rule is productive when its
// start is live (worklist over reverse edges). A root that can never end is refused, naming the
// rule with no way to end; dead edges are dropped. Returns which rules are productive.
std::vector<char> PdaBuilder::prune_dead(const std::vector<char>& used,
                                         const std::vector<uint32_t>& start) {
  const size_t n_rules = g_.rules.size();
  const size_t n = nodes_.size();
  std::vector<char> live(n, 0), productive(n_rules, 0);
  std::vector<std::vector<uint32_t>> rev(n), callers(n_rules);
  budget_.spend(n + n_rules);
  for (uint32_t i = 0; i < n; ++i) {
    budget_.spend(nodes_[i].bytes.size() + nodes_[i].tokens.size() + nodes_[i].calls.size());
    for (const auto& e : nodes_[i].bytes) rev[e.to].push_back(i);
    for (const auto& e : nodes_[i].tokens) rev[e.to].push_back(i);
    for (const auto& e : nodes_[i].calls) {
      rev[e.ret].push_back(i);
      callers[e.rule].push_back(i);
    }
  }
  std::vector<uint32_t> work;
  auto check = [&](uint32_t m) {
    if (live[m]) return;
    const DNode& d = nodes_[m];
    budget_.spend(1 + d.bytes.size() + d.tokens.size() + d.calls.size());
    bool ok = d.final;
    for (const auto& e : d.bytes) ok = ok || live[e.to];
    for (const auto& e : d.tokens) ok = ok || live[e.to];
    for (const auto& e : d.calls) ok = ok || (productive[e.rule] && live[e.ret]);
    if (ok) {
      live[m] = 1;
      work.push_back(m);
    }
  };
  for (uint32_t i = 0; i < n; ++i) check(i);
  while (!work.empty()) {
    const uint32_t m = work.back();
    work.pop_back();
    for (uint32_t p : rev[m]) check(p);
    const uint32_t r = nodes_[m].rule;
    if (start[r] == m && !productive[r]) {
      productive[r] = 1;
      for (uint32_t c : callers[r]) check(c);
    }
  }
  if (!productive[g_.root]) {
    std::string culprit = g_.names[g_.root];
    for (uint32_t r = 0; r < n_rules; ++r) {
      if (used[r] && !productive[r] && r != g_.root) {
        culprit = g_.names[r];
        break;
      }
    }
    fail_arg("grammar: can never be completed (rule `{}` has no way to end)", culprit);
  }
  for (auto& d : nodes_) {
    budget_.spend(1 + d.bytes.size() + d.tokens.size() + d.calls.size());
    std::erase_if(d.bytes, [&](const auto& e) { return !live[e.to]; });
    std::erase_if(d.tokens, [&](const auto& e) { return !live[e.to]; });
    std::erase_if(d.calls, [&](const auto& e) { return !productive[e.rule] || !live[e.ret]; });
  }
  return productive;
}

// Left recursion: a rule reaching a call of itself without consuming input is refused. Returns
// which rules can end without consuming input (nullable), which FIRST needs.
std::vector<char> PdaBuilder::refuse_left_recursion(const std::vector<char>& productive,
                                                    const std::vector<uint32_t>& start) {
  const size_t n_rules = g_.rules.size();
  std::vector<char> nullable(n_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < n_rules; ++r) {
      if (!productive[r] || nullable[r]) continue;
      std::vector<uint32_t> seen{start[r]}, st{start[r]};
      bool reach = false;
      budget_.spend(1);
      while (!st.empty() && !reach) {
        const uint32_t m = st.back();
        st.pop_back();
        if (nodes_[m].final) reach = true;
        budget_.spend(1 + nodes_[m].calls.size() * seen.size());
        for (const auto& c : nodes_[m].calls) {
          if (nullable[c.rule] && std::find(seen.begin(), seen.end(), c.ret) == seen.end()) {
            seen.push_back(c.ret);
            st.push_back(c.ret);
          }
        }
      }
      if (reach) nullable[r] = changed = true;
    }
  }
  std::vector<std::vector<uint32_t>> left(n_rules);
  for (uint32_t r = 0; r < n_rules; ++r) {
    if (!productive[r]) continue;
    std::vector<uint32_t> seen{start[r]}, st{start[r]};
    while (!st.empty()) {
      const uint32_t m = st.back();
      st.pop_back();
      budget_.spend(1 + nodes_[m].calls.size() * seen.size());
      for (const auto& c : nodes_[m].calls) {
        left[r].push_back(c.rule);
        if (nullable[c.rule] && std::find(seen.begin(), seen.end(), c.ret) == seen.end()) {
          seen.push_back(c.ret);
          st.push_back(c.ret);
        }
      }
    }
  }
  std::vector<uint8_t> color(n_rules, 0);  // 0 new, 1 on the path, 2 done
  for (uint32_t r0 = 0; r0 < n_rules; ++r0) {
    if (color[r0] != 0 || !productive[r0]) continue;
    std::vector<std::pair<uint32_t, size_t>> st{{r0, 0}};
    color[r0] = 1;
    while (!st.empty()) {
      budget_.spend(1);
      auto& [r, i] = st.back();
      if (i < left[r].size()) {
        const uint32_t c = left[r][i++];
        if (color[c] == 1)
          fail_arg(
              "grammar: rule `{}` is left-recursive (it can reach itself without consuming "
              "input); rewrite it with repetition",
              g_.names[c]);
        if (color[c] == 0) {
          color[c] = 1;
          st.push_back({c, 0});
        }
      } else {
        color[r] = 2;
        st.pop_back();
      }
    }
  }

  return nullable;
}

// The automaton reachable from the root's start, renumbered into the compact Pda.
Pda PdaBuilder::renumber(const std::vector<uint32_t>& start) {
  const size_t n_rules = g_.rules.size();
  const size_t n = nodes_.size();
  std::vector<uint32_t> id(n, Pda::kNone);
  std::vector<uint32_t> order;
  auto visit = [&](uint32_t m) {
    if (id[m] == Pda::kNone) {
      id[m] = static_cast<uint32_t>(order.size());
      order.push_back(m);
    }
  };
  visit(start[g_.root]);
  for (size_t i = 0; i < order.size(); ++i) {
    const DNode& d = nodes_[order[i]];
    budget_.spend(2 * (1 + d.bytes.size() + d.tokens.size() + 2 * d.calls.size()));
    for (const auto& e : d.bytes) visit(e.to);
    for (const auto& e : d.tokens) visit(e.to);
    for (const auto& e : d.calls) {
      visit(start[e.rule]);
      visit(e.ret);
    }
  }
  Pda p;
  p.names_ = g_.names;
  p.root_ = g_.root;
  p.rule_start_.assign(n_rules, Pda::kNone);
  for (uint32_t r = 0; r < n_rules; ++r) {
    if (start[r] != Pda::kNone && id[start[r]] != Pda::kNone) p.rule_start_[r] = id[start[r]];
  }
  for (uint32_t m : order) {
    const DNode& d = nodes_[m];
    Pda::Node nd;
    nd.rule = d.rule;
    nd.final = d.final;
    nd.bytes_begin = static_cast<uint32_t>(p.byte_edges_.size());
    for (auto e : d.bytes) p.byte_edges_.push_back({e.lo, e.hi, id[e.to]});
    nd.bytes_end = static_cast<uint32_t>(p.byte_edges_.size());
    nd.tokens_begin = static_cast<uint32_t>(p.token_edges_.size());
    for (auto e : d.tokens) p.token_edges_.push_back({e.token, e.negated, id[e.to]});
    nd.tokens_end = static_cast<uint32_t>(p.token_edges_.size());
    nd.calls_begin = static_cast<uint32_t>(p.call_edges_.size());
    for (auto e : d.calls) p.call_edges_.push_back({e.rule, id[e.ret]});
    nd.calls_end = static_cast<uint32_t>(p.call_edges_.size());
    nd.terminal = !d.bytes.empty() || !d.tokens.empty();
    nd.tail = d.final && d.bytes.empty() && d.tokens.empty() && d.calls.empty();
    p.nodes_.push_back(nd);
  }
  return p;
}

// FIRST (bytes that can be consumed first from a node, the rule's FOLLOW where it may end) and
// FOLLOW per rule, to a fixpoint.
void PdaBuilder::first_and_follow(Pda& p, const std::vector<char>& nullable) {
  const size_t n_rules = g_.rules.size();
  std::vector<std::bitset<256>> first(p.nodes_.size());
  p.follow_.assign(n_rules, {});
  for (bool changed = true; changed;) {
    changed = false;
    // Nodes are numbered from the root forwards and FIRST flows backwards: visit in reverse.
    for (uint32_t i = static_cast<uint32_t>(p.nodes_.size()); i-- > 0;) {
      std::bitset<256> f = first[i];
      budget_.spend(1 + 4 * p.calls(i).size());
      for (const auto& e : p.bytes(i)) {
        budget_.spend(1 + (e.hi - e.lo) / 16);
        for (unsigned b = e.lo; b <= e.hi; ++b) f.set(b);
      }
      for (const auto& c : p.calls(i)) {
        f |= first[p.rule_start_[c.rule]];
        if (nullable[c.rule]) f |= first[c.ret];
        const std::bitset<256> fr = p.follow_[c.rule] | first[c.ret];
        if (fr != p.follow_[c.rule]) {
          p.follow_[c.rule] = fr;
          changed = true;
        }
      }
      if (p.nodes_[i].final) f |= p.follow_[p.nodes_[i].rule];
      if (f != first[i]) {
        first[i] = f;
        changed = true;
      }
    }
  }
}

// The steps of a compile, in order; each spends from the one budget.
Pda PdaBuilder::run() {
  const std::vector<char> used = reachable_rules();
  const std::vector<uint32_t> start = build_rules(used);
  const std::vector<char> productive = prune_dead(used, start);
  const std::vector<char> nullable = refuse_left_recursion(productive, start);
  Pda p = renumber(start);
  first_and_follow(p, nullable);
  return p;
}

Pda Pda::compile(const Grammar& g, const Limits& limits) {
  if (g.root >= g.rules.size() || !g.rules[g.root]) fail_arg("grammar: no root rule");
  const BudgetScope scope;
  try {
    return PdaBuilder(g, limits, scope.budget()).run();
  } catch (const BudgetExceeded& e) {
    throw BudgetExceeded(std::string("grammar: ") + e.what());
  }
}

}  // namespace deltafin::grammar
