// One sequence's generation as a state machine the caller drives pass by pass: next_input()
// gives the tokens to feed (a prompt chunk, then the last sampled token), on_logits() takes the
// logits of that pass's last row. The CLI runs one Generation at a time; the server batches
// the inputs of several into one forward pass. Stop rules: a stop token (the config's
// eos_token_id and <|end_of_msg|>), the token limit, the context limit, stop strings and
// cancellation.
//
// Output is produced as events. In chat mode the K3 output parser splits the thinking channel
// from the response and recognises tool calls; in raw mode all text is content (special tokens
// and K3 tags are structure, never text: PlainTextFilter). Stop strings apply to the content
// channel: text that could be the start of a stop string is held back until it is known not to
// be, and the match itself is never emitted.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "generate/sampler.h"
#include "grammar/constraint.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

enum class StopReason { kNone, kLength, kContext, kStopToken, kEndOfTurn, kStopString, kCancelled };
const char* stop_reason_name(StopReason r);

struct GenerationParams {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_ids;
  int top_logprobs = -1;        // -1: no logprobs; 0: the chosen token's; k: and the k best
  int64_t prefill_chunk = 256;  // prompt rows per pass
  int64_t context_limit = 0;    // positions the sequence may reach (0 = no limit)
  bool chat = false;            // parse the output as a K3 assistant turn
  Channel start_channel = Channel::think;
  // What the output must follow (docs/STRUCTURED-OUTPUT.md): each token is sampled from the
  // tokens it allows, and a stop token only where it may end. Null: unconstrained.
  std::shared_ptr<const grammar::Constraint> constraint;
};

struct GeneratedToken {
  int32_t id = 0;
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

struct GenerationTiming {
  double start = 0;         // construction
  double prefill_done = 0;  // the prompt's last pass finished
  double first_token = 0;   // the first token sampled
  double last_token = 0;
  int64_t prompt_tokens = 0;
  double mask_s = 0;  // computing the constraint's masks and advancing its matcher
};

class Generation {
 public:
  // `prompt` are the tokens to feed before generating (may be empty when `pending_token` is
  // given: a token sampled earlier that the state has not consumed yet). `start_position` is
  // the state's position when generation starts (for the context limit).
  Generation(std::vector<int32_t> prompt, const GenerationParams& params,
             const Tokenizer* tokenizer, int64_t vocab, int64_t start_position = 0);
  // A continued sequence: `preceding` are the ids the state already holds (a kept chat state or
  // a restored prefix snapshot, prefix/reuse.h), so generation starts at their count, and the
  // repetition penalty's prompt window reaches back into them: a continued request samples
  // exactly as one that prefilled the whole prompt.
  Generation(std::vector<int32_t> prompt, const GenerationParams& params,
             const Tokenizer* tokenizer, int64_t vocab, std::span<const int32_t> preceding);

  std::span<const int32_t> next_input() const;
  // While the prompt is being fed: the next pass takes at most `rows` (>= 1) of it. A scheduler
  // sharing one pass among sequences uses it; the rest of the prompt follows in later passes.
  void limit_input(int64_t rows);
  // The logits of the last row of the pass that consumed next_input().
  void on_logits(std::span<const float> logits);
  // A row of a verify pass (src/generate/speculative.h): the logits after next_input(), when
  // the drafter guessed `draft` next. With `q` (the draft's distribution, [vocab]) the token is
  // chosen by speculative rejection sampling, so it is distributed exactly as a plain draw;
  // without, it is sampled exactly as on_logits() would (same draws). Returns whether the token
  // chosen is the draft, which is then the next input, as after any sampled token.
  bool on_draft_logits(std::span<const float> logits, int32_t draft, std::span<const float> q);
  void cancel();
  // Ends a generation whose pass failed (the request's error goes to its client).
  void abort(StopReason reason = StopReason::kCancelled);

  bool finished() const { return stop_ != StopReason::kNone; }
  StopReason stop_reason() const { return stop_; }
  // The stop string that ended the generation (kStopString), else empty.
  const std::string& stop_string() const { return stop_string_; }
  bool in_prefill() const { return fed_ < static_cast<int64_t>(prompt_.size()); }
  int64_t prompt_done() const { return fed_; }
  std::span<const int32_t> prompt() const { return prompt_; }
  // Tokens it may still sample before the token limit.
  int64_t tokens_left() const {
    return params_.max_new_tokens - static_cast<int64_t>(tokens_.size());
  }
  int64_t prompt_size() const { return static_cast<int64_t>(prompt_.size()); }

  // Events produced since the last call.
  std::vector<ParserEvent> take_events();
  const std::vector<GeneratedToken>& tokens() const { return tokens_; }
  std::vector<int32_t> completion_ids() const;
  // Accumulated output (content is what the user sees; after a stop string, up to it).
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ParsedToolCall>& tool_calls() const { return tool_calls_; }
  bool malformed_output() const { return malformed_; }
  // Tokens the state has consumed during this generation.
  int64_t consumed() const { return consumed_; }
  // The last sampled token when the state has not consumed it (it ended the generation).
  std::optional<int32_t> unconsumed_token() const;
  const GenerationTiming& timing() const { return timing_; }
  uint64_t seed() const { return sampler_.seed(); }
  // How many of `drafts` (proposed to follow the last sampled token) the constraint allows in a
  // row: the drafting round cuts a proposal there (a copy of the matcher is advanced; this
  // generation's state is untouched). All of them without a constraint.
  size_t allowed_drafts(std::span<const int32_t> drafts) const;
  // The mask work of the pass being assembled that is still cold: the grammar nodes, not computed
  // yet, whose masks the rows this pass samples will need (after its last prompt row, or after
  // the last sampled token and each of `drafts` in turn). run_round computes them while the
  // forward pass runs; what is warm costs a bitset union per row afterwards. Empty without a
  // constraint or when the pass samples nothing.
  grammar::ColdNodes cold_mask_nodes(std::span<const int32_t> drafts) const;
  // The generation ended (token limit, context) while its constraint was still incomplete: the
  // output does not parse as the grammar asks.
  bool constraint_unfinished() const;

 private:
  void consume(std::span<const float> logits, const int32_t* draft, std::span<const float> q,
               bool* accepted);
  void emit(ParserEvent e);
  void handle_content(std::string delta);
  void finish(StopReason r);

  std::vector<int32_t> prompt_;
  std::vector<int32_t> window_;  // the penalty's prompt window when it reaches into `preceding`
  GenerationParams params_;
  const Tokenizer* tok_;
  Sampler sampler_;
  std::optional<OutputParser> parser_;
  std::optional<PlainTextFilter> plain_;
  std::optional<grammar::Matcher> matcher_;
  grammar::TokenMask mask_;
  int64_t fed_ = 0;       // prompt tokens fed
  int64_t consumed_ = 0;  // all tokens fed
  int64_t position_;
  std::vector<int32_t> input_;
  std::vector<GeneratedToken> tokens_;
  std::vector<int32_t> generated_ids_;
  std::vector<ParserEvent> events_;
  std::string content_, held_, reasoning_;
  std::vector<ParsedToolCall> tool_calls_;
  size_t max_stop_ = 0;
  bool malformed_ = false;
  bool last_consumed_ = true;
  StopReason stop_ = StopReason::kNone;
  std::string stop_string_;
  GenerationTiming timing_;
};

}  // namespace deltafin
