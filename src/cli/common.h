// Helpers shared by the subcommands: options every engine command takes, and small parsers.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace deltafin {
class Model;
}

namespace deltafin::cli {

struct EngineOptions {
  std::string model;
  int threads = 0;
  std::string kernels;        // force a kernel table
  std::string memory_budget;  // SIZE, "" = default share of RAM
  bool mmap = false;
  std::string cache_policy = "lru";
  int readers = 4;
  bool no_prefetch = false;
  bool no_direct_io = false;
  std::string trunk = "bf16";
  int64_t ctx = 0;         // positions per sequence to plan for (0 = min(model, 8192))
  int sequences = 1;       // states to plan for (the server sets this)
  int64_t max_rows = 256;  // rows per pass to plan for
  bool verbose = false;  // print the memory plan and the kernels even when stderr is not a terminal
};

// Flag validators with one-line messages.
CLI::Validator non_negative();
CLI::Validator positive();

// Adds --model (required unless `model_optional`), --threads and --kernels to a subcommand.
void add_engine_options(CLI::App* cmd, EngineOptions& o, bool model_optional = false);
// Applies --threads / --kernels; call at the start of a command.
void apply_engine_options(const EngineOptions& o);
// Checks the folder exists and loads it (errors say what is missing).
std::unique_ptr<Model> load_model(const EngineOptions& o);

// The model folder for run/chat: --model, else $DELTAFIN_MODEL, else the demo checkpoint in the
// user cache folder (created on first use, and announced on stderr).
std::string resolve_model_dir(const std::string& flag);
// Where the demo lives: $DELTAFIN_CACHE, else $XDG_CACHE_HOME/deltafin, else ~/.cache/deltafin.
std::string cache_dir();
// Where the expert heat statistics of a model folder persist (in the cache folder).
std::string heat_file_for(const std::string& model_dir);
// True when `dir` holds tiktoken.model and tokenizer_config.json.
bool has_tokenizer(const std::string& dir);
// Throws InvalidArgument unless `dir` is an existing folder (naming it) that holds a tokenizer
// ("DIR has no tokenizer (...); WHO needs one").
void require_tokenizer(const std::string& dir, const char* who);
// Throws InvalidArgument unless `dir` exists and is a folder.
void require_model_folder(const std::string& dir);

// "3,1,4" or "[3, 1, 4]" -> ids. Throws InvalidArgument naming `what`.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what);

// "2G", "512M", "1.5" (GiB), ... -> bytes. Throws InvalidArgument naming `what`.
uint64_t parse_size(const std::string& text, const std::string& what);

std::string human_bytes(double bytes);

}  // namespace deltafin::cli
