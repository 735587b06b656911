// Helpers shared by the subcommands: options every engine command takes, and small parsers.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/units.h"
#include "engine/engine.h"
#include "generate/driver.h"
#include "runtime/load.h"
#include "tokenizer/chat.h"

namespace deltafin::cli {

// The engine options and loading live in the engine (engine/engine.h), shared with the server
// and the C API; the CLI adds only its flags.
using deltafin::apply_engine_options;
using deltafin::cache_dir;
using deltafin::disk_bytes;
using deltafin::EngineOptions;
using deltafin::heat_file_for;
using deltafin::human_bytes;
using deltafin::load_model;
using deltafin::parse_size;
using deltafin::require_model_folder;

// A usage error (a flag's value, a missing or conflicting flag): `main` prints it with a pointer to
// the subcommand's --help and exits 2, as the parser's own errors do. Bad files and runtime
// failures stay Error / InvalidArgument (exit 1).
class UsageError : public InvalidArgument {
 public:
  explicit UsageError(const std::string& message) : InvalidArgument(message) {}
};

template <typename... Args>
[[noreturn]] void fail_usage(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// Flag validators with one-line messages.
CLI::Validator non_negative();
CLI::Validator positive();
// --prefill-chunk: "auto" or a whole number >= 1.
CLI::Validator auto_or_positive();
// The rows of --prefill-chunk: 0 for "auto" (the memory plan chooses), else the number.
int64_t prefill_chunk_rows(const std::string& flag);

// Speculative decoding flags of run, chat, bench and serve.
struct DraftOptions {
  // "" (the default): the model folder's draft/ subfolder when it has one, else none; then
  // none | ngram | mtp | DIR (replay:FILE is a test aid).
  std::string draft;
  std::string draft_max = "auto";  // auto (the cost model chooses) or N
};
// Adds --draft and --draft-max; a bad value is a usage error (one line, exit 2).
void add_draft_options(CLI::App* cmd, DraftOptions& o);

// Prefix snapshot flags of chat, serve and bench --turns (prefix/prefix_store.h), read into the
// load request's typed settings (a bad size is a usage error naming the flag). A command without
// them keeps no snapshots (load_request turns the store off).
void add_state_cache_options(CLI::App* cmd, StateCacheSettings& o);

// The built-in demo's note that it drafts (with which drafter), when `draft` is its own.
void note_demo_drafter(const std::string& model_dir, const std::string& draft);

// The load request of an engine command's flags: the engine options, the draft flags (the
// default drafter is the model folder's draft/ subfolder, as the built-in demo ships its trained
// EAGLE-3.1 drafter; `--draft none` turns it off) and --prefill-chunk. The command adds what it
// knows (prompt rows, sequences) and calls load_engine (runtime/load.h).
LoadRequest load_request(const EngineOptions& e, const DraftOptions& d,
                         const std::string& prefill_chunk = "auto");

// Adds --model, --threads and --kernels to a subcommand (the command resolves --model with
// resolve_model_dir).
void add_engine_options(CLI::App* cmd, EngineOptions& o);

// The model folder of every command that reads one: --model, else $DELTAFIN_MODEL, else the
// demo checkpoint in the user cache folder (created on first use, and announced on stderr).
std::string resolve_model_dir(const std::string& flag);
// --model of the commands that need only the tokenizer files (tokenize, render).
void add_tokenizer_model_option(CLI::App* cmd, std::string& model);
// True when `dir` holds tiktoken.model and tokenizer_config.json.
bool has_tokenizer(const std::string& dir);
// Throws InvalidArgument unless `dir` is an existing folder (naming it) that holds a tokenizer
// ("DIR has no tokenizer (...); WHO needs one").
void require_tokenizer(const std::string& dir, const char* who);

// Writes `bytes` to stdout and flushes; throws Error when it cannot (a closed pipe, a full disk).
void write_stdout(std::string_view bytes);

// "3,1,4" or "[3, 1, 4]" -> ids. Throws InvalidArgument naming `what`.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what);

// `--image FILE` / `/image FILE`: the file's bytes as an image part named by its path (a regular
// file within the image limits; its type from its first bytes). Throws InvalidArgument.
ChatImage read_image_part(const std::string& path);
// A rendered prompt's images for --json and render/tokenize: name, size, SHA-256, token spans.
nlohmann::ordered_json images_json(std::span<const PromptImage> images);

}  // namespace deltafin::cli
