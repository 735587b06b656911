// Which chat format a model speaks, decided once from its own files.
//
// The Kimi models share one vocabulary but not one chat format: K3 writes XTML with four markers
// (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>); the K2 family (K2-Instruct, K2-Thinking, K2.5,
// Kimi-Linear) writes role tokens and <|im_middle|>/<|im_end|> at the same ids under other names
// (docs/FAMILY.md "Chat formats and tokenizers"). So the format cannot be a constant: it is read
// from the model folder when the tokenizer is loaded (Tokenizer::load) and travels with the
// Tokenizer value, and everything that writes or reads a turn (the renderer, the output parser,
// the turn constraint, the stop ids) asks `tok.chat_format()`. The rule, in order:
//  1. the tokenizer names K3's four markers: k3 (also the answer when it names neither set, so a
//     tokenizer without chat markers fails where K3's are needed, as before);
//  2. it names K2's markers (<|im_user|>, <|im_assistant|>, <|im_system|>, <|im_middle|>,
//     <|im_end|>): a K2-family format, chosen by
//     a. config.json `model_type` "kimi_linear" or `architectures` KimiLinearForCausalLM:
//        kimi-linear;
//     b. `model_type` "kimi_k25" or `architectures` KimiK25ForConditionalGeneration: k2.5;
//     c. the chat template (tokenizer_config.json `chat_template`, else chat_template.jinja)
//        writes `<think>`: k2-thinking; a template without it: k2-instruct;
//     d. no template: k2-thinking when the tokenizer has a <think> token, else k2-instruct.
// A front end may override the rule (`deltafin render --chat-format`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltafin {

class Tokenizer;

enum class ChatFormat {
  k3,           // XTML (docs/MODEL.md §5.3)
  k2_instruct,  // the first K2-Instruct template
  k2_thinking,  // K2-Thinking: think blocks, tool-call sections, `## Return of` results
  k2_5,         // K2-Thinking's structure; the generation prompt opens <think> (or <think></think>)
  kimi_linear,  // K2 markers, tool-call sections, no think blocks, no default system prompt
};

// "k3", "k2-instruct", "k2-thinking", "k2.5", "kimi-linear".
const char* chat_format_name(ChatFormat f);
std::optional<ChatFormat> parse_chat_format(std::string_view name);
// The names parse_chat_format accepts, for help and error texts: "k3, k2-instruct, ...".
std::string chat_format_names();

bool is_k2_family(ChatFormat f);
// Whether the model writes a reasoning channel at all (k3, k2-thinking, k2.5).
bool format_thinks(ChatFormat f);

// What a model folder says beyond the special-token names (each part optional).
struct ChatFormatEvidence {
  std::string chat_template;  // tokenizer_config.json `chat_template` (the "default" entry of a
                              // list), else chat_template.jinja; empty when there is neither
  std::string model_type;     // config.json, top level
  std::vector<std::string> architectures;
};

// Reads the evidence from `dir`. A config.json that is not JSON, a chat_template of the wrong
// shape and an unreadable or oversized chat_template.jinja are errors naming the file.
ChatFormatEvidence read_chat_format_evidence(const std::string& dir);

// The rule above.
ChatFormat chat_format_for(const Tokenizer& tok, const ChatFormatEvidence& evidence);

// The ids that end an assistant turn, by name from the tokenizer: <|end_of_msg|> for K3;
// <|im_end|> and [EOS] for the K2 family (the config's eos_token_id is [EOS] in K2 and K2-Thinking,
// so the chat stop must come from here). Names the tokenizer lacks are left out.
std::vector<int32_t> chat_stop_ids(const Tokenizer& tok);

}  // namespace deltafin
