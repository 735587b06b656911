// `deltafin make-model`: writes a synthetic checkpoint in the exact release layout (random
// weights, a real architecture: K3, Kimi-Linear with --preset kimi-linear, the DeepSeek-V3
// architecture as Kimi K2 / K2-Thinking / K2.5 / DeepSeek-V3 release it with --preset k2, k2-int4,
// k25, deepseek-v3) for tests, benchmarks and the demo.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <atomic>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "fixtures/synthetic.h"
#include "fixtures/synthetic_draft.h"
#include "model/config.h"

namespace deltafin::cli {

namespace {
struct MakeModelArgs {
  std::string out;
  std::string preset = "tiny";
  int64_t layers = 0, experts = 0, top_k = 0, hidden = 0, vocab = 0, dense_layers = -1, block = 0;
  int64_t groups = 0;
  int64_t max_positions = 0;
  std::vector<int64_t> mla_layers;
  double scaling = 0;
  std::string format;
  std::string shard_size;
  uint64_t seed = 1;
  bool no_tokenizer = false;
  bool quiet = false;
  int threads = 0;
  std::string drafter, target, draft_stream;
  std::string vision;
  std::vector<int> draft_taps;
};

// SIGINT/SIGTERM while writing: the progress callback sees the flag and throws, so the library
// removes its partial folder on the way out (a killed process would leave it behind).
std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
}

// --drafter KIND --target DIR: a draft model folder for that target instead of a target.
void run_make_draft(const MakeModelArgs& a) {
  if (a.target.empty())
    fail_arg("--drafter {} needs --target DIR (the model it drafts for)", a.drafter);
  require_model_folder(a.target);
  SyntheticDraftSpec s = synthetic_draft_preset(a.drafter);
  s.seed = a.seed;
  s.taps = a.draft_taps;
  if (a.draft_stream == "attn_res") {
    if (s.kind != DraftKind::kDSpark)
      fail_arg("--draft-stream attn_res: only DSpark drafts tap the mixture");
    s.stream = TapStream::kMixture;
  } else if (!a.draft_stream.empty() && a.draft_stream != "prefix") {
    fail_arg("--draft-stream {}: expected prefix or attn_res", a.draft_stream);
  }
  const auto r = make_draft_model(a.out, s, load_config(a.target));
  if (!a.quiet) {
    fmt::print(stderr, "make-model: wrote a {} draft for {} ({}, {} tensors) to {}\n", a.drafter,
               a.target, human_bytes(static_cast<double>(r.bytes)), r.tensors, a.out);
  }
}

void run_make_model(const MakeModelArgs& a) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  set_global_threads(a.threads);
  if (!a.drafter.empty()) return run_make_draft(a);
  if (!a.target.empty()) fail_arg("--target is only for --drafter");
  SyntheticSpec s = synthetic_preset(a.preset);
  if (!a.vision.empty()) s.vision = synthetic_vision_preset(a.vision);
  if (a.layers > 0) s.layers = a.layers;
  if (a.experts > 0) s.experts = a.experts;
  if (a.top_k > 0) s.top_k = a.top_k;
  if (a.hidden > 0) s.hidden = a.hidden;
  if (a.vocab > 0) s.vocab = a.vocab;
  if (a.max_positions > 0) s.max_positions = a.max_positions;
  if (a.dense_layers >= 0) s.first_k_dense = a.dense_layers;
  if (a.block > 0) s.attn_res_block = a.block;
  if (!a.mla_layers.empty()) s.mla_layers = a.mla_layers;
  if (a.scaling > 0) s.routed_scaling = a.scaling;
  if (!a.format.empty() && s.family == Family::kKimiLinear && a.format != "bf16")
    fail_arg("--experts-format {}: Kimi-Linear's experts are BF16", a.format);
  if (a.block > 0 && s.family == Family::kKimiLinear)
    fail_arg("--attn-res-block: Kimi-Linear has no Attention Residuals");
  if (s.vision && s.family == Family::kKimiLinear)
    fail_arg("--vision: Kimi-Linear is a text model (only --preset tiny or k3 take a tower)");
  if (!a.format.empty()) {
    const bool ds = s.family == Family::kDeepseekV3;
    if (a.format == "mxfp4" && !ds)
      s.expert_format = ExpertFormat::kMXFP4;
    else if (a.format == "bf16")
      s.expert_format = ExpertFormat::kBF16;
    else if (a.format == "fp8" && ds)
      s.expert_format = ExpertFormat::kFP8;
    else if (a.format == "int4" && ds)
      s.expert_format = ExpertFormat::kInt4;
    else
      fail_arg("--experts-format {}: expected {}", a.format,
               ds ? "fp8 (and an FP8 trunk), int4 (BF16 trunk) or bf16 (everything BF16) for a "
                    "DeepSeek-V3 / K2 preset"
                  : "mxfp4 or bf16");
  }
  if (a.groups > 0) {
    if (s.family != Family::kDeepseekV3)
      fail_arg("--groups: only the DeepSeek-V3 family routes by groups");
    s.groups = a.groups;
    s.topk_groups = std::max<int64_t>(1, a.groups / 2);
  }
  if (!a.shard_size.empty()) s.shard_bytes = parse_size(a.shard_size, "shard size");
  s.seed = a.seed;
  // DeepSeek-V3's own tokenizer (tokenizer.json BPE) is not made here; its preset has none.
  s.tokenizer = !a.no_tokenizer && s.model_type != "deepseek_v3";
  if (s.vocab < 512)
    fail_arg("--vocab {}: must be at least 512 (256 byte tokens + 256 special ids)", s.vocab);
  if (s.top_k > s.experts) fail_arg("--top-k {} exceeds --experts {}", s.top_k, s.experts);
  double last_report = 0;
  auto r = make_model(a.out, s, [&](const MakeModelProgress& p) {
    if (const int sig = g_signal.load())
      fail("interrupted by signal {}; the partial checkpoint was removed", sig);
    if (!a.quiet && p.bytes_total > (256ull << 20) &&
        (p.seconds - last_report > 2.0 || p.bytes_written == p.bytes_total)) {
      last_report = p.seconds;
      fmt::print(stderr, "\rmake-model: {} / {} ({:.0f} MB/s)   ",
                 human_bytes(static_cast<double>(p.bytes_written)),
                 human_bytes(static_cast<double>(p.bytes_total)),
                 p.bytes_written / 1e6 / std::max(p.seconds, 1e-9));
    }
  });
  if (!a.quiet) {
    fmt::print(stderr,
               "{}make-model: wrote {} ({} tensors in {} shards) to {} in {:.1f} s ({:.0f} MB/s)\n",
               r.bytes > (256ull << 20) ? "\n" : "", human_bytes(static_cast<double>(r.bytes)),
               r.tensors, r.shards, a.out, r.seconds, r.bytes / 1e6 / std::max(r.seconds, 1e-9));
  }
}
}  // namespace

void register_make_model(CLI::App& app) {
  auto a = std::make_shared<MakeModelArgs>();
  auto* cmd = app.add_subcommand("make-model",
                                 "Write a synthetic checkpoint (random weights, release layout)");
  cmd->add_option("OUT", a->out, "Output folder (created; must not hold anything)")->required();
  cmd->add_option("--preset", a->preset,
                  "tiny (the golden tiny shape), k3 (real K3 dimensions, 4 layers, "
                  "32 experts, vocab 32768 unless overridden), kimi-linear (Kimi-Linear-48B's "
                  "dimensions, BF16: 4 layers — KDA + dense, 2 KDA + MoE, MLA + MoE — 32 experts "
                  "top-8, vocab 32768 unless overridden), k2 (Kimi-K2-Instruct-0905's dimensions, "
                  "FP8 with 128x128 block scales: 3 layers — dense, 2 MoE — 32 experts top-8, "
                  "vocab 32768), k2-int4 (K2-Thinking: BF16 trunk, INT4 experts), k25 (K2.5's "
                  "text model, nested, INT4 experts) or deepseek-v3 (DeepSeek-V3's dimensions, "
                  "FP8: 4 layers — 2 dense, 2 MoE — 32 experts in 8 groups, the MTP layer, no "
                  "tokenizer)")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers,
                  "Number of layers (MLA at every 4th and the last unless --mla-layers)")
      ->check(positive());
  cmd->add_option("--experts", a->experts, "Routed experts per MoE layer")->check(positive());
  cmd->add_option("--top-k", a->top_k, "Experts per token")->check(positive());
  cmd->add_option("--hidden", a->hidden, "Hidden size")->check(positive());
  cmd->add_option("--vocab", a->vocab, "Vocabulary size (>= 512; the last 256 ids are special)")
      ->check(positive());
  cmd->add_option("--max-positions", a->max_positions,
                  "max_position_embeddings: the context the model allows (tiny: 4096)")
      ->check(positive());
  cmd->add_option("--dense-layers", a->dense_layers,
                  "first_k_dense_replace: leading dense-FFN layers")
      ->check(non_negative());
  cmd->add_option("--attn-res-block", a->block, "Attention-residual block size")->check(positive());
  cmd->add_option("--mla-layers", a->mla_layers,
                  "1-based MLA layers, e.g. 4,8,9 (the rest are KDA)")
      ->delimiter(',');
  cmd->add_option("--routed-scaling", a->scaling, "routed_scaling_factor")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--experts-format", a->format,
                  "mxfp4 (K3's default) or bf16; for the DeepSeek-V3 / K2 presets fp8 (with an "
                  "FP8 trunk), int4 (BF16 trunk) or bf16 (all BF16)");
  cmd->add_option("--groups", a->groups,
                  "DeepSeek-V3 presets: n_group (the router keeps the best half of the groups)")
      ->check(positive());
  cmd->add_option("--shard-size", a->shard_size,
                  "Target shard size, e.g. 4G (default 4M tiny, 4G k3)");
  cmd->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  cmd->add_flag("--no-tokenizer", a->no_tokenizer,
                "Do not write tiktoken.model / tokenizer_config.json");
  cmd->add_flag("--quiet", a->quiet, "No progress output");
  cmd->add_option("--threads", a->threads, "Generator threads (default: one per physical core)");
  cmd->add_option(
         "--vision", a->vision,
         "Add a vision tower + projector of the released structure: tiny (D 64, 2 layers), "
         "demo (D 32, 2 layers, 16x16 position grid: the built-in demo's) or release (D 1024, 27 "
         "layers), random weights, with preprocessor_config.json")
      ->check(CLI::IsMember({"tiny", "demo", "release"}));
  cmd->add_option("--drafter", a->drafter,
                  "Write a synthetic draft model for --target instead: eagle3.1, eagle3 or dspark");
  cmd->add_option("--target", a->target, "The model folder a --drafter is made for");
  cmd->add_option("--draft-taps", a->draft_taps,
                  "0-based target layers the draft taps (default: 1, middle, last but one)")
      ->delimiter(',');
  cmd->add_option("--draft-stream", a->draft_stream,
                  "prefix (raw AttnRes partial, default) or attn_res (the mixture; DSpark only)");
  cmd->callback([a] { run_make_model(*a); });
}

}  // namespace deltafin::cli
