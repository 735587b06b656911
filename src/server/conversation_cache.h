// Kept states of recently answered chat conversations (issue item 7), so that the next turn of a
// conversation costs only its new tokens.
//
// An entry is keyed by `canon`: the K3 rendering (ids, no generation prompt) of the conversation
// *including the answer as the server returned it* — what a client that sends the conversation
// back will have as the prefix of its next prompt. The state itself consumed `seen`: the prompt
// plus the ids the model generated, which may tokenize the answer differently from the renderer
// (the model's own ids are kept, as the chat command does). The entry is only made when `seen`
// followed by `feed` is *segment-equal* to canon: the same special tokens in the same places and
// byte-identical text between them. `feed` is what the state has not consumed yet (the closing
// structure of a turn cut by the token limit, the rest of a partial text run). So continuing
// from the state feeds the model exactly the text a fresh prefill of canon would; anything else
// (an answer the client edited, a stop string, output the parser flagged, a different system
// prompt, tool_choice or response_format blocks, which the renderer places after the messages)
// simply finds no entry and prefills from scratch.
//
// Entries are moved out when used (a state is mutated by its next turn), bounded in count, and
// evicted least recently used first. Thread-safe: HTTP threads publish, the engine takes.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "model/state.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

struct KeptConversation {
  std::vector<int32_t> canon;  // the key
  State state;                 // consumed `seen`
  std::vector<int32_t> seen;
  std::vector<int32_t> feed;  // to feed before the next turn's new ids
};

// The ids R such that `history` followed by R is segment-equal to `canon` (see above), or none
// when history is not a segment prefix of canon.
std::optional<std::vector<int32_t>> segment_completion(const Tokenizer& tok,
                                                       std::span<const int32_t> history,
                                                       std::span<const int32_t> canon);

class ConversationCache {
 public:
  explicit ConversationCache(size_t capacity) : capacity_(capacity) {}

  void put(KeptConversation entry);
  // Removes and returns the entry with the longest canon that `prompt` starts with (and extends).
  std::optional<KeptConversation> take(std::span<const int32_t> prompt);
  size_t size() const;
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  mutable std::mutex m_;
  std::list<KeptConversation> entries_;  // most recently used first
};

}  // namespace deltafin::server
