// What `run` and `chat` share: sampling and stop flags, the SIGINT flag, and the printer that
// streams a generation's events to the terminal (thinking dimmed or hidden, tool calls shown).
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "cli/common.h"
#include "engine/engine.h"
#include "generate/generation.h"
#include "generate/generation_config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::cli {

struct GenOptions {
  int64_t max_new = 256;
  // The sampling flags, read straight into the generation's settings (checked by sampling_from).
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool hide_thinking = false;
  bool no_color = false;
  bool stats = false;
  bool stats_live = false;
  std::string prefill_chunk = "auto";  // or rows per pass
  int64_t prefill_rows = 0;            // what the loaded model's pass plan chose
  DraftOptions draft;
  CLI::App* cmd = nullptr;        // the subcommand (which flags were given)
  GenerationDefaults generation;  // the model folder's generation_config.json
  std::string grammar_file;       // --grammar-file: GBNF
  std::string json_schema;        // --json-schema: JSON text, or @FILE
};

void add_gen_options(CLI::App* cmd, GenOptions& o);
// Reads the model folder's generation_config.json: its sampling settings replace the defaults
// of the flags that were not given, its eos_token_id joins the stop tokens (make_params).
void apply_generation_config(GenOptions& o, const std::string& model_dir);
// The sampling settings of the flags, validated (a bad value is a usage error naming the field).
SamplingParams sampling_from(const GenOptions& o);
// The generation parameters for a model (stop ids: stop_ids_for the config, the tokenizer and
// generation_config.json); the prefill chunk is the model's pass plan (which honours
// --prefill-chunk).
GenerationParams make_params(const GenOptions& o, const Model& m, const Tokenizer* tok, bool chat);

// The constraint of --grammar-file / --json-schema (null without them): over the whole output,
// or with `chat` over the answer of a K3 turn that starts in `start` (thinking stays free).
// Throws InvalidArgument naming the flag.
std::shared_ptr<const grammar::Constraint> constraint_for(const GenOptions& o, const Tokenizer* tok,
                                                          bool chat, Channel start);

// Ctrl-C: the first SIGINT sets the flag (generation stops cleanly at the next pass); a second
// one while still running restores the default action.
void install_sigint();
std::atomic<bool>& interrupted();

// Streams events: content to stdout as it arrives, reasoning between "[thinking]" and
// "[/thinking]" lines (dimmed on a terminal; hidden with --hide-thinking), tool calls as a
// one-line summary; without a tokenizer, token ids separated by spaces.
class Printer {
 public:
  Printer(const GenOptions& o, bool have_tokenizer, bool quiet);
  void on_step(Generation& g);
  void finish();  // ends the line if anything was printed

 private:
  const GenOptions& o_;
  bool tok_, quiet_, color_, dim_ = false, printed_ = false, at_line_start_ = true;
  bool thinking_ = false;  // inside the thinking marks
  size_t ids_shown_ = 0;
  int64_t last_prefill_shown_ = -1;
};

}  // namespace deltafin::cli
