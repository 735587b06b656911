// A checkpoint's generation_config.json (Hugging Face's file, optional): the sampling its
// publisher chose as the default and the ids that end a sequence. Read as vLLM reads it: the
// sampling fields (temperature, top_k, top_p, min_p, repetition_penalty) become the defaults of
// requests that do not set them — flags of `run` and `chat`, request fields of the server and
// the C API always win — and `eos_token_id` adds stop tokens to the config's. `do_sample`,
// `max_new_tokens` and the other fields are not read (vLLM too samples at the file's
// temperature whatever `do_sample` says). Without the file nothing changes: the CLI stays
// greedy, the server takes OpenAI's defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "generate/sampler.h"
#include "model/config.h"

namespace deltafin {

class Tokenizer;

struct GenerationDefaults {
  std::string path;  // the file read ("" when the folder has none)
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::vector<int64_t> eos_token_ids;

  // Sets in `s` every sampling field the file gives.
  void apply(SamplingParams& s) const;
};

// Parses generation_config.json text (`path` in messages); throws Error naming the file and
// every field that is wrong (a type, a range).
GenerationDefaults parse_generation_config(const std::string& text, const std::string& path);
// The model folder's generation_config.json, or empty defaults when it has none.
GenerationDefaults load_generation_config(const std::string& model_dir);

// The ids that end a generation: the config's eos_token_id (all of them), the file's
// eos_token_id, and <|end_of_msg|> when the tokenizer has it (K3's end of turn), each once.
// Throws Error when the file names an id outside the vocabulary.
std::vector<int32_t> stop_ids_for(const ModelConfig& c, const Tokenizer* tok,
                                  const GenerationDefaults& g);

}  // namespace deltafin
