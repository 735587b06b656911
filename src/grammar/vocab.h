// A tokenizer's vocabulary as the matcher sees it: the bytes of every ordinary token in a trie
// (depth-first order, so a subtree is a contiguous range and a rejected prefix skips it), the
// special tokens (matched only by token elements of a grammar), and the cache of compiled
// grammars for this vocabulary (by the hash of what they were compiled from).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/gbnf.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::grammar {

class CompiledGrammar;

class TokenVocab {
 public:
  struct TrieNode {
    uint8_t byte;
    uint16_t depth;         // 1 for the first byte of a token
    uint32_t skip;          // index just past this node's subtree
    uint32_t tokens_begin;  // tokens ending here: token_ids()[tokens_begin, tokens_end)
    uint32_t tokens_end;
  };

  // `bytes[id]` for every id; `special[id]` marks ids matched only as whole tokens (their bytes
  // are then their names, used for `<name>` references).
  TokenVocab(std::vector<std::string> bytes, std::vector<bool> special);

  // The vocabulary of `tok` (built once per tokenizer and shared).
  static std::shared_ptr<const TokenVocab> of(const Tokenizer& tok);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  bool is_special(int32_t id) const { return special_[static_cast<size_t>(id)]; }
  std::string_view bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  size_t max_token_bytes() const { return max_len_; }
  // Resolves `<text>` for the GBNF parser: a special token's name, else an ordinary token's bytes.
  const TokenLookup& lookup() const { return lookup_; }

  // A grammar compiled for this vocabulary from `key` (the text it was compiled from, with any
  // options), or nullptr; `put` keeps the last kCacheEntries.
  std::shared_ptr<const CompiledGrammar> cached(const std::string& key) const;
  void put(const std::string& key, std::shared_ptr<const CompiledGrammar> g) const;
  static constexpr size_t kCacheEntries = 32;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  size_t max_len_ = 0;
  std::unordered_map<std::string, int32_t> by_text_;
  TokenLookup lookup_;

  mutable std::mutex mu_;
  struct Entry {
    size_t hash;
    std::string key;
    std::shared_ptr<const CompiledGrammar> grammar;
  };
  mutable std::list<Entry> lru_;
};

}  // namespace deltafin::grammar
