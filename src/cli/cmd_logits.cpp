// `deltafin logits`: exact logits for a token sequence, written as float32 little-endian
// [T, vocab] (row t = logits after tokens[0..t]). The three modes run the same sequence as one
// prefill pass, one token per pass, or a prefix pass then single-token passes; they must agree.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/model.h"

namespace deltafin::cli {

namespace {
struct LogitsArgs {
  EngineOptions engine;
  std::string tokens;
  std::string mode = "prefill";
  std::string out;
};

void run_logits(LogitsArgs& a) {
  auto ids = parse_id_list(a.tokens, "--tokens");
  check_output_target(a.out);  // before the model loads
  a.engine.model = resolve_model_dir(a.engine.model);
  int64_t split = -1;
  if (a.mode == "prefill") {
    split = static_cast<int64_t>(ids.size());
  } else if (a.mode == "decode") {
    split = 0;
  } else if (a.mode.rfind("split:", 0) == 0) {
    try {
      size_t used = 0;
      split = std::stoll(a.mode.substr(6), &used);
      if (used != a.mode.size() - 6) split = -1;
    } catch (...) {
      split = -1;
    }
    if (split < 0 || split > static_cast<int64_t>(ids.size())) {
      fail_arg("--mode {}: N must be an integer in 0..{} (the number of tokens)", a.mode,
               ids.size());
    }
  } else {
    fail_arg("--mode {}: expected prefill, decode or split:N", a.mode);
  }
  auto model = load_model(a.engine);
  State state = model->new_state();
  std::vector<float> all;
  std::span<const int32_t> span(ids);
  if (split > 0) {
    all = model->forward(state, span.subspan(0, static_cast<size_t>(split)), /*all_logits=*/true);
  }
  for (size_t t = static_cast<size_t>(split); t < ids.size(); ++t) {
    auto row = model->forward(state, span.subspan(t, 1), true);
    all.insert(all.end(), row.begin(), row.end());
  }
  write_file_atomic(a.out, std::string_view(reinterpret_cast<const char*>(all.data()),
                                            all.size() * sizeof(float)));
}
}  // namespace

void register_logits(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  auto* cmd = app.add_subcommand("logits",
                                 "Write exact logits [T, vocab] (float32 LE) for a token sequence");
  add_engine_options(cmd, args->engine);
  cmd->add_option("--tokens", args->tokens, "Token ids, e.g. 5,17,200")->required();
  cmd->add_option(
         "--mode", args->mode,
         "prefill (one pass), decode (one token per pass) or split:N (prefill N, then decode)")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Output file")->required();
  cmd->callback([args] { run_logits(*args); });
}

}  // namespace deltafin::cli
