#include "grammar/vocab.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace deltafin::grammar {

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<bool> special)
    : bytes_(std::move(bytes)), special_(std::move(special)) {
  if (special_.size() != bytes_.size()) fail("token vocabulary: sizes differ");
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    if (!special_[static_cast<size_t>(id)] && !bytes_[static_cast<size_t>(id)].empty())
      order.push_back(id);
    by_text_.emplace(bytes_[static_cast<size_t>(id)], id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)] ||
           (bytes_[static_cast<size_t>(a)] == bytes_[static_cast<size_t>(b)] && a < b);
  });
  std::vector<uint32_t> path;  // trie indices of the current prefix
  std::string_view prev;
  for (int32_t id : order) {
    const std::string_view b = bytes_[static_cast<size_t>(id)];
    size_t l = 0;
    while (l < prev.size() && l < b.size() && prev[l] == b[l]) ++l;
    while (path.size() > l) {
      trie_[path.back()].skip = static_cast<uint32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t d = l; d < b.size(); ++d) {
      const auto at = static_cast<uint32_t>(trie_tokens_.size());
      trie_.push_back({static_cast<uint8_t>(b[d]), static_cast<uint16_t>(d + 1), 0, at, at});
      path.push_back(static_cast<uint32_t>(trie_.size() - 1));
    }
    trie_tokens_.push_back(id);
    trie_[path.back()].tokens_end = static_cast<uint32_t>(trie_tokens_.size());
    max_len_ = std::max(max_len_, b.size());
    prev = b;
  }
  while (!path.empty()) {
    trie_[path.back()].skip = static_cast<uint32_t>(trie_.size());
    path.pop_back();
  }
  lookup_.vocab = size();
  lookup_.find = [this](std::string_view text) -> std::optional<int32_t> {
    const auto it = by_text_.find(std::string(text));
    if (it == by_text_.end()) return std::nullopt;
    return it->second;
  };
}

std::shared_ptr<const TokenVocab> TokenVocab::of(const Tokenizer& tok) {
  static std::mutex mu;
  // A few tokenizers at most per process; each entry keeps its tokenizer alive, so its identity
  // cannot be reused by another while cached.
  static std::list<std::pair<Tokenizer, std::shared_ptr<const TokenVocab>>> cache;
  std::lock_guard lock(mu);
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if (it->first.identity() == tok.identity()) {
      cache.splice(cache.begin(), cache, it);
      return cache.front().second;
    }
  }
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  std::vector<bool> special(bytes.size());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    bytes[static_cast<size_t>(id)] = std::string(tok.token_bytes(id));
    special[static_cast<size_t>(id)] = tok.is_special(id);
  }
  auto v = std::make_shared<const TokenVocab>(std::move(bytes), std::move(special));
  cache.emplace_front(tok, v);
  if (cache.size() > 4) cache.pop_back();
  return v;
}

std::shared_ptr<const CompiledGrammar> TokenVocab::cached(const std::string& key) const {
  const size_t h = std::hash<std::string>{}(key);
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->hash == h && it->key == key) {
      lru_.splice(lru_.begin(), lru_, it);
      return lru_.front().grammar;
    }
  }
  return nullptr;
}

void TokenVocab::put(const std::string& key, std::shared_ptr<const CompiledGrammar> g) const {
  const size_t h = std::hash<std::string>{}(key);
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->hash == h && it->key == key) {
      lru_.erase(it);
      break;
    }
  }
  lru_.push_front({h, key, std::move(g)});
  while (lru_.size() > kCacheEntries) lru_.pop_back();
}

}  // namespace deltafin::grammar
