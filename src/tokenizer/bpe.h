// Rank-ordered BPE merging of one pre-tokenizer piece (tiktoken's algorithm).
//
// Rule: start from single bytes; repeatedly merge the adjacent pair whose concatenated bytes
// have the lowest rank, the leftmost such pair on ties; stop when no adjacent pair is a token.
// Two implementations with identical results: a quadratic scan (tiktoken's own, fastest for
// short pieces) and a heap over a linked list for long pieces. Both are templates over the rank
// lookup so the tests can run them side by side on the same table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <string_view>
#include <utility>
#include <vector>

namespace deltafin::bpe {

// Pieces up to this many bytes use the quadratic scan.
inline constexpr std::size_t kQuadraticLimit = 128;

// "No such pair" in the quadratic scan (larger than every rank).
inline constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Reusable buffers (one per encode call) so typical pieces allocate nothing.
struct Scratch {
  std::vector<std::pair<uint32_t, int32_t>> parts;  // (start offset, rank of pair starting here)
  std::vector<int32_t> next, prev, pair_rank;
  std::vector<std::pair<int64_t, int32_t>> heap;
};

// `rank(bytes)` returns the rank of `bytes` or -1. Appends the ids of `piece` to `out`.
template <typename RankFn>
void merge_quadratic(std::string_view piece, const RankFn& rank, std::vector<int32_t>& out,
                     Scratch& s) {
  const auto as_rank = [](int32_t r) { return r < 0 ? kNoRank : r; };
  auto& parts = s.parts;
  parts.clear();
  const auto n = static_cast<uint32_t>(piece.size());
  for (uint32_t i = 0; i + 1 < n; ++i) parts.emplace_back(i, as_rank(rank(piece.substr(i, 2))));
  parts.emplace_back(n - 1, kNoRank);
  parts.emplace_back(n, kNoRank);
  // Rank of the part that would span parts[i] .. parts[i+3) once parts[i+1] is merged away.
  const auto rank_after = [&](std::size_t i) {
    if (i + 3 >= parts.size()) return kNoRank;
    return as_rank(rank(piece.substr(parts[i].first, parts[i + 3].first - parts[i].first)));
  };
  for (;;) {
    int32_t best = kNoRank;
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].second < best) {
        best = parts[i].second;
        at = i;
      }
    }
    if (best == kNoRank) break;
    if (at > 0) parts[at - 1].second = rank_after(at - 1);
    parts[at].second = rank_after(at);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    out.push_back(rank(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first)));
  }
}

template <typename RankFn>
void merge_heap(std::string_view piece, const RankFn& rank, std::vector<int32_t>& out, Scratch& s) {
  const auto n = static_cast<int32_t>(piece.size());
  auto& next = s.next;
  auto& prev = s.prev;
  auto& pr = s.pair_rank;  // rank of the pair (node, next node); -1 none; -2 node merged away
  next.resize(n);
  prev.resize(n);
  pr.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  const auto pair_rank = [&](int32_t i) -> int32_t {
    const int32_t j = next[i];
    if (j >= n) return -1;
    return rank(piece.substr(static_cast<std::size_t>(i), static_cast<std::size_t>(next[j] - i)));
  };
  // Min-heap on (rank, start): the lowest rank, then the leftmost pair, exactly as the scan.
  using Entry = std::pair<int64_t, int32_t>;
  auto& heap = s.heap;
  heap.clear();
  const auto cmp = std::greater<Entry>();
  const auto push = [&](int32_t i) {
    pr[i] = pair_rank(i);
    if (pr[i] >= 0) {
      heap.emplace_back(pr[i], i);
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const auto [r, i] = heap.back();
    heap.pop_back();
    if (pr[i] != r) continue;  // stale: the node was merged away or its pair changed
    const int32_t j = next[i];
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    pr[j] = -2;
    push(i);
    if (prev[i] >= 0) push(prev[i]);
  }
  for (int32_t i = 0; i < n; i = next[i]) {
    out.push_back(
        rank(piece.substr(static_cast<std::size_t>(i), static_cast<std::size_t>(next[i] - i))));
  }
}

}  // namespace deltafin::bpe
