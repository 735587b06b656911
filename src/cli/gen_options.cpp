#include "cli/gen_options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/common.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "grammar/k3_turn.h"

namespace deltafin::cli {

void add_gen_options(CLI::App* cmd, GenOptions& o) {
  o.cmd = cmd;
  cmd->add_option("--max-new", o.max_new, "Most tokens to generate")
      ->capture_default_str()
      ->check(non_negative());
  // The sampling defaults below apply when the model folder has no generation_config.json;
  // with one, its settings are the defaults (a flag given always wins).
  cmd->add_option("--temperature", o.sampling.temperature,
                  "Sampling temperature; 0 = greedy. Default: the model's generation_config.json, "
                  "else 0")
      ->capture_default_str();
  cmd->add_option(
         "--top-k", o.sampling.top_k,
         "Keep the K most likely tokens (0 = off; default: generation_config.json, else 0)")
      ->capture_default_str();
  cmd->add_option("--top-p", o.sampling.top_p,
                  "Nucleus sampling threshold (1 = off; default: generation_config.json, else 1)")
      ->capture_default_str();
  cmd->add_option("--min-p", o.sampling.min_p,
                  "Drop tokens below min-p x the best probability (0 = off; default: "
                  "generation_config.json, else 0)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", o.sampling.repetition_penalty,
                  "Repetition penalty over generated and the last 64 prompt tokens (1 = off; "
                  "default: generation_config.json, else 1)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o.sampling.presence_penalty,
                  "OpenAI presence penalty (-2..2)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o.sampling.frequency_penalty,
                  "OpenAI frequency penalty (-2..2)")
      ->capture_default_str();
  cmd->add_option_function<uint64_t>(
         "--seed",
         [&o](uint64_t v) {
           o.sampling.seed = v;
           o.sampling.has_seed = true;
         },
         "Random seed, 0 to 2^64-1 (same seed + settings = same output)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const bool ok = !v.empty() && v.size() <= 20 &&
                            v.find_first_not_of("0123456789") == std::string::npos &&
                            (v.size() < 20 || v <= "18446744073709551615");
            return ok ? "" : "expected a whole number from 0 to 18446744073709551615, found " + v;
          },
          "0..2^64-1"));
  cmd->add_option("--stop", o.stop, "Stop when the response text contains STR (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--hide-thinking", o.hide_thinking, "Do not show the thinking channel");
  cmd->add_flag("--no-color", o.no_color,
                "No ANSI styling (also when NO_COLOR is set or stdout is not a terminal)");
  cmd->add_flag("--stats", o.stats, "Print statistics at the end (stderr)");
  cmd->add_flag("--stats-live", o.stats_live, "Also print a statistics line per token (stderr)");
  cmd->add_option("--prefill-chunk", o.prefill_chunk,
                  "Prompt tokens per forward pass: auto (as many as the memory budget holds) or N")
      ->capture_default_str()
      ->check(auto_or_positive());
  add_draft_options(cmd, o.draft);
  cmd->add_option("--grammar-file", o.grammar_file,
                  "Constrain the output (with --chat, the answer) to this GBNF grammar");
  cmd->add_option(
      "--json-schema", o.json_schema,
      "Constrain the output (with --chat, the answer) to this JSON Schema (JSON text or @FILE)");
}

std::shared_ptr<const grammar::Constraint> constraint_for(const GenOptions& o, const Tokenizer* tok,
                                                          bool chat, Channel start) {
  if (o.grammar_file.empty() && o.json_schema.empty()) return nullptr;
  if (!o.grammar_file.empty() && !o.json_schema.empty())
    fail_usage("--grammar-file and --json-schema cannot be combined");
  const char* flag = o.grammar_file.empty() ? "--json-schema" : "--grammar-file";
  if (tok == nullptr) fail_arg("{}: the model has no tokenizer", flag);
  grammar::TurnSpec spec;
  spec.field = flag;
  spec.thinking = start == Channel::think;
  auto read_flag_file = [flag](const std::string& path) {
    try {
      return read_file(path);
    } catch (const std::exception& e) {
      fail_arg("{}: {}", flag, e.what());
    }
  };
  if (!o.grammar_file.empty()) {
    spec.content = grammar::TurnSpec::Content::gbnf;
    spec.gbnf = read_flag_file(o.grammar_file);
  } else {
    const std::string text =
        o.json_schema[0] == '@' ? read_flag_file(o.json_schema.substr(1)) : o.json_schema;
    spec.content = grammar::TurnSpec::Content::json_schema;
    spec.schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (spec.schema.is_discarded()) fail_arg("--json-schema: not valid JSON");
  }
  try {
    if (chat)
      return std::make_shared<const grammar::Constraint>(grammar::k3_turn_constraint(spec, *tok));
    if (!o.grammar_file.empty())
      return std::make_shared<const grammar::Constraint>(
          grammar::raw_constraint_gbnf(spec.gbnf, *tok));
    return std::make_shared<const grammar::Constraint>(
        grammar::raw_constraint_schema(spec.schema, *tok, flag));
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.rfind("grammar: ", 0) == 0) fail_arg("{}: {}", flag, what.substr(9));
    throw;
  }
}

void apply_generation_config(GenOptions& o, const std::string& model_dir) {
  o.generation = load_generation_config(model_dir);
  const GenerationDefaults& g = o.generation;
  auto unset = [&o](const char* flag) { return o.cmd == nullptr || o.cmd->count(flag) == 0; };
  SamplingParams& s = o.sampling;
  if (g.temperature && unset("--temperature")) s.temperature = *g.temperature;
  if (g.top_k && unset("--top-k")) s.top_k = *g.top_k;
  if (g.top_p && unset("--top-p")) s.top_p = *g.top_p;
  if (g.min_p && unset("--min-p")) s.min_p = *g.min_p;
  if (g.repetition_penalty && unset("--repeat-penalty"))
    s.repetition_penalty = *g.repetition_penalty;
}

SamplingParams sampling_from(const GenOptions& o) {
  const SamplingParams& s = o.sampling;
  try {
    s.validate();
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());  // a sampling flag's value: a usage error
  }
  return s;
}

GenerationParams make_params(const GenOptions& o, const Model& m, const Tokenizer* tok, bool chat) {
  GenerationParams p;
  p.max_new_tokens = o.max_new;
  p.sampling = sampling_from(o);
  p.stop_strings = o.stop;
  p.stop_ids = stop_ids_for(m.config(), tok, o.generation);
  p.prefill_chunk = m.pass_plan().pass_rows;
  p.context_limit = m.config().max_positions;
  p.chat = chat;
  return p;
}

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) std::signal(SIGINT, SIG_DFL);
}
}  // namespace

void install_sigint() {
  std::signal(SIGINT, on_sigint);
}
std::atomic<bool>& interrupted() {
  return g_interrupted;
}

Printer::Printer(const GenOptions& o, bool have_tokenizer, bool quiet)
    : o_(o), tok_(have_tokenizer), quiet_(quiet) {
  color_ = !o.no_color && ::isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
}

void Printer::on_step(Generation& g) {
  auto events = g.take_events();
  // Prompt progress on long prompts (stderr, terminals only).
  if (o_.prefill_rows > 0 && g.prompt_size() > o_.prefill_rows && ::isatty(STDERR_FILENO) &&
      g.prompt_done() != last_prefill_shown_) {
    last_prefill_shown_ = g.prompt_done();
    fmt::print(stderr, "\rprefill {} / {} tokens{}", g.prompt_done(), g.prompt_size(),
               g.in_prefill() ? "" : "\n");
  }
  if (!quiet_) {
    auto out = [&](const std::string& s) {
      if (s.empty()) return;
      std::fwrite(s.data(), 1, s.size(), stdout);
      printed_ = true;
      at_line_start_ = s.back() == '\n';
    };
    auto set_dim = [&](bool on) {
      if (color_ && on != dim_) {
        out(on ? "\x1b[2m" : "\x1b[0m");
        dim_ = on;
      }
    };
    if (!tok_) {
      const auto& toks = g.tokens();
      for (; ids_shown_ < toks.size(); ++ids_shown_)
        out(fmt::format("{}{}", ids_shown_ ? " " : "", toks[ids_shown_].id));
    }
    // The thinking channel between plain-text marks, so the boundary shows without colour
    // too (piped, NO_COLOR); on a terminal it is dimmed as well.
    auto end_thinking = [&] {
      if (!thinking_) return;
      out(at_line_start_ ? "[/thinking]\n" : "\n[/thinking]\n");
      thinking_ = false;
      set_dim(false);
    };
    for (auto& e : events) {
      switch (e.kind) {
        case ParserEvent::Kind::reasoning:
          if (o_.hide_thinking || e.text.empty()) break;
          set_dim(true);
          if (!thinking_) out(at_line_start_ ? "[thinking]\n" : "\n[thinking]\n");
          thinking_ = true;
          out(e.text);
          break;
        case ParserEvent::Kind::content:
          if (e.text.empty()) break;
          end_thinking();
          set_dim(false);
          out(e.text);
          break;
        case ParserEvent::Kind::tool_call_end:
          end_thinking();
          set_dim(false);
          out(fmt::format("{}[tool call {}({})]\n", at_line_start_ ? "" : "\n", e.name, e.text));
          break;
        default:
          break;
      }
    }
    if (g.finished()) {
      end_thinking();
      set_dim(false);
    }
    std::fflush(stdout);
  }
  if (o_.stats_live && !g.tokens().empty() && !g.in_prefill()) {
    const auto& t = g.timing();
    const double el = t.last_token - t.first_token;
    const size_t n = g.tokens().size();
    fmt::print(stderr, "[live] token {} id {} at {:.3f} s, {:.2f} tokens/s\n", n,
               g.tokens().back().id, t.last_token - t.start, n > 1 && el > 0 ? (n - 1) / el : 0.0);
  }
}

void Printer::finish() {
  if (printed_ && !at_line_start_) std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace deltafin::cli
