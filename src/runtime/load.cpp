// The one load path (see load.h).
#include "runtime/load.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "draft/draft_model.h"
#include "draft/mtp.h"
#include "draft/tap_drafter.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/inventory.h"
#include "vision/preprocess.h"

namespace deltafin {

namespace fs = std::filesystem;

namespace {

bool is_model_drafter(const std::string& spec) {
  return spec != "none" && spec != "ngram" && spec.rfind("replay", 0) != 0;
}

bool has_tokenizer_files(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "tiktoken.model", ec) &&
         fs::is_regular_file(fs::path(dir) / "tokenizer_config.json", ec);
}

}  // namespace

std::string default_draft(const std::string& model_dir) {
  const fs::path own = fs::path(model_dir) / "draft";
  std::error_code ec;
  return fs::is_regular_file(own / "config.json", ec) ? own.string() : "none";
}

void check_draft_spec(const std::string& spec) {
  make_drafter(spec);  // none, ngram and replay are built and dropped; a folder is checked
}

LoadedEngine load_engine(LoadRequest r) {
  EngineOptions& e = r.engine;
  require_model_folder(e.model);
  LoadedEngine out;
  out.draft = r.draft.empty() ? default_draft(e.model) : r.draft;
  out.draft_max = r.draft_max;
  check_draft_spec(out.draft);
  if (r.loaded_tokenizer) {
    out.tokenizer = std::move(r.loaded_tokenizer);
  } else if (has_tokenizer_files(e.model)) {
    out.tokenizer = Tokenizer::load(e.model);
  } else if (r.tokenizer == NeedTokenizer::kRequired) {
    fail_arg("{} has no tokenizer (tiktoken.model + tokenizer_config.json); {} needs one", e.model,
             r.who);
  }
  const ModelConfig config = load_config(e.model);
  PlanShape shape;
  // A draft model is opened once, here, and counted before the target's memory is divided.
  if (is_model_drafter(out.draft)) {
    // "mtp": the model's own MTP layer (DeepSeek-V3), counted like a draft folder's weights.
    auto dm =
        out.draft == "mtp" ? open_mtp_model(e.model, config) : open_draft_model(out.draft, config);
    shape.draft_weight_bytes = dm->weight_bytes();
    shape.draft_cache_bytes_per_position = dm->cache_bytes_per_position();
    if (e.verbose) fmt::print(stderr, "draft: {}\n", dm->describe());
    out.draft_model = std::move(dm);
  }
  // Passes: a verify pass holds the last token and its drafts for each decoding sequence.
  const int64_t verify = out.draft == "none" ? 1 : out.draft_max.verify_rows();
  const int64_t parallel = std::max(1, r.parallel);
  shape.sequences = std::max(1, r.sequences);
  shape.max_rows = r.prefill_chunk > 0 ? parallel * std::max(r.prefill_chunk, verify) : 0;
  shape.prefill_rows = r.prompt_rows > 0 ? std::max(r.prompt_rows, verify) : 0;
  // A vision tower's working memory is planned for the largest image its processor can make
  // (a text-only folder's file is not used; a bad one is reported by VisionEncoder::open).
  if (const fs::path pre = fs::path(e.model) / "preprocessor_config.json"; fs::exists(pre)) {
    try {
      shape.vision_max_patches = vision::max_patches(
          vision::parse_media_proc_config(read_regular_file(pre.string()), pre.string()));
    } catch (const std::exception&) {
      shape.vision_max_patches = 0;
    }
    shape.vision_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  const StateCacheSettings& cache = r.state_cache;
  if (cache.enabled) {
    shape.state_cache_bytes =
        cache.ram_bytes.value_or(default_state_cache_bytes(config, plan_context(config, e.ctx)));
  }
  out.model = load_model(e, shape);
  out.pass_rows = std::max(out.model->pass_plan().pass_rows, parallel * verify);
  if (out.tokenizer && out.tokenizer->vocab_size() > out.model->config().vocab) {
    fail("the tokenizer has {} ids but the model's vocabulary is {}", out.tokenizer->vocab_size(),
         out.model->config().vocab);
  }
  if (cache.enabled) {
    PrefixStoreOptions so;
    so.model_id = model_state_id(*out.model, e);
    so.ram_bytes = shape.state_cache_bytes;
    so.disk_bytes = cache.disk_bytes;
    if (cache.disk_bytes > 0) {
      if (!cache.dir.empty()) {
        so.dir = cache.dir;
      } else {
        try {
          so.dir = (fs::path(cache_dir()) / "states" / so.model_id).string();
        } catch (const std::exception&) {
          so.dir.clear();  // no cache folder: RAM only
        }
      }
    }
    out.store = std::make_unique<PrefixStore>(out.model->config(), std::move(so));
    if (e.verbose) fmt::print(stderr, "{}\n", out.store->describe());
  }
  if (out.model->inventory().vision) {
    out.vision = VisionEncoder::open(e.model, &out.model->pool());
    if (out.vision->config().text_hidden != out.model->config().hidden) {
      fail("{}: the vision tower's rows are {} wide, the text model's {}", e.model,
           out.vision->config().text_hidden, out.model->config().hidden);
    }
  }
  return out;
}

std::string model_state_id(const LoadedModel& model, const EngineOptions& e) {
  std::string config;
  try {
    config = read_file((fs::path(e.model) / "config.json").string());
  } catch (const std::exception&) {
  }
  std::vector<std::string> lines;
  const Checkpoint& ck = model.checkpoint();
  for (const auto& [name, t] : ck.tensors()) {
    lines.push_back(
        fmt::format("{} {} {} {} {} {}", name, static_cast<int>(t.dtype), t.shape_string(),
                    fs::path(ck.shards()[static_cast<size_t>(t.shard)].path()).filename().string(),
                    t.offset, t.nbytes));
  }
  // The weights themselves, sampled: the first 256 bytes of every tensor outside the routed
  // experts (the trunk, read at load anyway; K3 has a few thousand), so a fine-tune with the
  // same headers is another checkpoint.
  for (const auto& [name, t] : ck.tensors()) {
    if (t.data == nullptr || is_routed_expert_tensor(name)) continue;
    lines.emplace_back(reinterpret_cast<const char*>(t.data),
                       static_cast<size_t>(std::min<uint64_t>(t.nbytes, 256)));
  }
  lines.push_back(fmt::format("trunk {} kernels {} device {}", trunk_format_name(e.trunk),
                              kernels::active().name, model.gpu() ? "gpu" : "cpu"));
  return checkpoint_id(config, lines);
}

std::unique_ptr<Drafter> LoadedEngine::new_drafter() {
  if (draft_model) return draft_model->new_drafter(*model);
  return make_drafter(draft, {model->config().vocab, model.get()});
}

DraftConfig LoadedEngine::draft_config(std::unique_ptr<Drafter>& holder) {
  holder = new_drafter();
  DraftConfig cfg;
  cfg.drafter = holder.get();
  cfg.set_max(draft_max);
  return cfg;
}

std::function<std::unique_ptr<Drafter>()> LoadedEngine::drafter_factory() {
  if (draft == "none") return {};
  return [this] { return new_drafter(); };
}

}  // namespace deltafin
