// The K3 tokenizer: tiktoken-style byte-level BPE with the Kimi pre-tokenizer and 256 special
// tokens after the last rank.
//
// Token ids must be exactly the model's, so this follows the reference (`tokenization_kimi.py`
// over tiktoken) step for step: the same input guards, the same pattern, the same "whole piece
// first, then lowest-rank merge, leftmost on ties" BPE. Special tokens are recognised only when
// the caller asks (`encode_with_special`, for trusted structural text); everything a user or a
// tool writes goes through `encode_ordinary`, where `<|open|>` is just eight characters.
//
// A Tokenizer is an immutable value with shared state: copying is cheap and every const method
// may be called from several threads at once. It also carries the model's chat format
// (chat_format.h), decided when it is loaded from the folder's files, because the same ids mean
// different things in K3 and in the K2 family and every reader of a turn needs to know which.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_format.h"

namespace deltafin {

class Tokenizer {
 public:
  static constexpr int32_t kNumSpecial = 256;
  static constexpr const char* kRankFile = "tiktoken.model";
  static constexpr const char* kConfigFile = "tokenizer_config.json";

  // Reads `dir`/tiktoken.model and `dir`/tokenizer_config.json, and decides the chat format
  // from the special names and the folder's evidence (chat_format.h: the chat template,
  // config.json). Throws deltafin::Error naming the file (and line) for unreadable or malformed
  // input.
  static Tokenizer load(const std::string& dir);

  // Builds a tokenizer from memory: `ranks[i]` holds the bytes of rank i; `special_names` maps
  // an offset in [0, 256) from the first special id to its name (others get
  // `<|reserved_token_N|>`). `origin` names the source in error messages. The chat format is
  // decided from the names alone.
  static Tokenizer from_ranks(std::vector<std::string> ranks,
                              const std::map<int32_t, std::string>& special_names,
                              const std::string& origin = "<memory>");

  // Special markers are plain text.
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Appends instead of returning (the chat renderer builds one id list from many spans).
  void encode_ordinary_append(std::string_view text, std::vector<int32_t>& out) const;
  // Every special token string (the 256 names) is recognised; the text between is ordinary.
  std::vector<int32_t> encode_with_special(std::string_view text) const;

  // Byte-exact concatenation of token bytes; special tokens decode to their names.
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token (a special token's name for special ids).
  std::string_view token_bytes(int32_t id) const;

  std::optional<int32_t> special_id(std::string_view name) const;
  // The rank whose bytes are exactly `bytes`, if any.
  std::optional<int32_t> rank_of(std::string_view bytes) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;  // n_ranks() + 256
  int32_t n_ranks() const;     // also the first special id

  // Throws deltafin::Error unless 0 <= id < vocab_size(); the message names the id and the size.
  void check_id(int32_t id) const;

  // Equal for copies of one loaded tokenizer (what caches of per-vocabulary data key on; the
  // chat format is not part of it, so caches that depend on the format key on it too).
  const void* identity() const { return impl_.get(); }

  ChatFormat chat_format() const { return format_; }
  // A copy that speaks `format` (an explicit choice that overrides the folder's rule).
  Tokenizer with_chat_format(ChatFormat format) const {
    Tokenizer t = *this;
    t.format_ = format;
    return t;
  }

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  ChatFormat format_ = ChatFormat::k3;
};

// Streams text out of generated ids without ever showing a broken character.
//
// push() returns the newly complete UTF-8 text: a trailing sequence that is a valid prefix of a
// character is held back until the next push; bytes that can never form a character are
// replaced right away by U+FFFD (one per maximal invalid subpart, the rule of Python's
// `decode("utf-8", "replace")`). flush() returns what is held as U+FFFD (an incomplete
// character at the end of a stream) and resets. So the concatenation of every push() and the
// final flush() is the lossy UTF-8 decoding of decode(ids), and equals decode(ids) whenever
// that is valid UTF-8. Special ids decode to their names. The Tokenizer must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  std::string push(int32_t id);
  // Same as push() for raw bytes (used by the output parser for text it re-emits).
  std::string push_bytes(std::string_view bytes);
  std::string flush();
  bool has_pending() const { return !held_.empty(); }

 private:
  const Tokenizer* tokenizer_;
  std::string held_;
};

}  // namespace deltafin
