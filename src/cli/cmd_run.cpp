// `deltafin run`: one completion. Raw by default (the prompt's ordinary tokens, or token ids
// given directly); with --chat the prompt is rendered as one K3 user turn and the output parsed
// into thinking / response / tool calls. Text streams to stdout, diagnostics to stderr; --json
// prints one object instead, for scripts.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/gen_options.h"
#include "cli/trace_option.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "generate/driver.h"
#include "runtime/sequence.h"
#include "tokenizer/chat.h"

namespace deltafin::cli {

namespace {
struct RunArgs {
  EngineOptions engine;
  std::string trace;  // --trace FILE
  GenOptions gen;
  std::optional<std::string> prompt;  // given but empty is its own error
  std::string prompt_ids, prompt_file, system, think = "on", effort = "max";
  std::vector<std::string> images;  // --image, in order
  bool chat = false, json = false;
};

void run_run(RunArgs& a) {
  const int given = a.prompt.has_value() + !a.prompt_ids.empty() + !a.prompt_file.empty();
  if (given == 0) fail_usage("no prompt: give one of --prompt, --prompt-ids or --prompt-file");
  if (given > 1) fail_usage("give only one of --prompt, --prompt-ids and --prompt-file");
  if (a.prompt && a.prompt->empty()) fail_usage("empty prompt: --prompt is \"\"");
  if (a.think != "on" && a.think != "off") fail_usage("--think {}: expected on or off", a.think);
  if (a.chat && !a.prompt_ids.empty())
    fail_usage("--chat renders text; it cannot take --prompt-ids");
  if (!a.chat && !a.system.empty()) fail_usage("--system needs --chat");
  a.engine.model = resolve_model_dir(a.engine.model);
  apply_generation_config(a.gen, a.engine.model);
  std::optional<Tokenizer> tok;
  if (has_tokenizer(a.engine.model)) {
    tok = Tokenizer::load(a.engine.model);
  } else if (a.prompt_ids.empty()) {
    fail_arg(
        "{} has no tokenizer (tiktoken.model + tokenizer_config.json): give the prompt as "
        "--prompt-ids",
        a.engine.model);
  }
  sampling_from(a.gen);  // checked before the (slow) model load

  if (!a.images.empty() && !a.prompt_ids.empty())
    fail_usage("--image goes into a text prompt; with --prompt-ids use `deltafin logits --image`");
  std::vector<ChatImage> images;
  for (const auto& path : a.images) images.push_back(read_image_part(path));
  // The prompt: ids, raw text, or one chat turn; images (docs/VISION.md §6) at the text's
  // <|kimi_image_placeholder|>s or before it, measured by the model's tower.
  auto make_prompt = [&](const ImageMeasurer& measure) {
    RenderedPrompt p;
    if (!a.prompt_ids.empty()) {
      p.ids = parse_id_list(a.prompt_ids, "--prompt-ids");
      return p;
    }
    std::string text = a.prompt_file.empty() ? *a.prompt : read_file(a.prompt_file);
    ChatMessage user{ChatMessage::Role::user, "", ""};
    place_images(text, images, user);
    if (a.chat) {
      ChatRequest req;
      if (!a.system.empty()) req.messages.push_back({ChatMessage::Role::system, "", a.system});
      req.messages.push_back(std::move(user));
      req.thinking = a.think == "on";
      req.reasoning_effort = a.effort;
      p = render(req, *tok, measure);
    } else if (images.empty()) {
      p.ids = tok->encode_ordinary(text);
    } else {
      p = encode_with_images(*tok, user, measure);
    }
    if (p.ids.empty()) fail_arg("the prompt is empty");
    return p;
  };
  // Without images the prompt is known before loading, and the plan sizes its passes for it;
  // images are measured by the loaded model's tower, so then the passes are planned for the
  // context.
  RenderedPrompt rendered;
  if (images.empty()) rendered = make_prompt({});
  // Plan memory for what this run needs: its prompt (in as few passes as the budget allows, or
  // in --prefill-chunk rows), its drafter and its context.
  const auto constraint = constraint_for(a.gen, tok ? &*tok : nullptr, a.chat,
                                         a.think == "on" ? Channel::think : Channel::response);
  LoadRequest req = load_request(a.engine, a.gen.draft, a.gen.prefill_chunk);
  req.prompt_rows = static_cast<int64_t>(rendered.ids.size());
  req.loaded_tokenizer = std::move(tok);
  LoadedEngine engine = load_engine(std::move(req));
  note_demo_drafter(a.engine.model, engine.draft);
  auto& model = engine.model;
  tok = std::move(engine.tokenizer);
  if (!images.empty()) rendered = make_prompt(image_measurer(engine.vision.get()));
  const std::vector<int32_t>& prompt = rendered.ids;
  a.gen.prefill_rows = model->pass_plan().pass_rows;
  GenerationParams params = make_params(a.gen, *model, tok ? &*tok : nullptr, a.chat);
  if (model->plan()) params.context_limit = model->plan()->context;
  params.start_channel = a.think == "on" ? Channel::think : Channel::response;
  params.constraint = constraint;
  if (!a.json) params.top_logprobs = -1;
  SequenceSpec spec{prompt, {}, params, {}};
  spec.images = rendered.images;
  spec.vision = engine.vision.get();
  Sequence seq(*model, tok ? &*tok : nullptr, nullptr, std::move(spec),
               SequenceDrafter(engine.new_drafter(), engine.draft_max), nullptr,
               /*record_stats=*/true);
  Printer printer(a.gen, tok.has_value(), a.json);
  install_sigint();
  seq.drive(&interrupted(), [&](Generation& g) { printer.on_step(g); });
  printer.finish();
  if (a.engine.verbose && seq.drafter() != nullptr)
    fmt::print(stderr, "{}\n", describe_draft_choice(seq.draft()));
  const RunStats stats = seq.run_stats();
  const Generation& gen = seq.gen();
  if (a.json) {
    nlohmann::json j = run_json(a.engine.model, prompt, gen, stats, a.chat);
    if (!rendered.images.empty()) j["prompt_images"] = images_json(rendered.images);
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (a.gen.stats) fmt::print(stderr, "{}\n", stats.summary());
}
}  // namespace

void register_run(CLI::App& app) {
  auto [cmd, a] = add_traced_engine_command<RunArgs>(
      app, "run", "Generate a completion (raw text, token ids, or one chat turn with --chat)",
      run_run);
  cmd->add_option("--prompt", a->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", a->prompt_ids,
                  "Prompt as token ids, e.g. 3,1,4 (models without a tokenizer, tests)");
  cmd->add_option("--prompt-file", a->prompt_file, "Read the prompt text from a file");
  cmd->add_option("--image", a->images,
                  "An image (PNG, JPEG, GIF, WebP) for a model with a vision tower (repeatable): "
                  "the images go before the prompt text, or in order where it holds "
                  "<|kimi_image_placeholder|>");
  cmd->add_flag("--chat", a->chat, "Render the prompt as one K3 user turn and parse the answer");
  cmd->add_option("--system", a->system, "System message (with --chat)");
  cmd->add_option("--think", a->think, "Thinking channel with --chat: on or off")
      ->capture_default_str();
  cmd->add_option("--effort", a->effort, "Reasoning effort with --chat: low, high or max")
      ->capture_default_str()
      ->check(CLI::IsMember({"low", "high", "max"}));
  add_gen_options(cmd, a->gen);
  cmd->add_flag("--json", a->json,
                "Print one JSON object (ids, text, stats) instead of streaming text");
}

}  // namespace deltafin::cli
