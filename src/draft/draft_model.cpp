// The draft-model factory (see draft_model.h).
#include "draft/draft_model.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "core/error.h"
#include "draft/dspark.h"
#include "draft/eagle3.h"
#include "draft/mtp.h"
#include "storage/checkpoint.h"

namespace deltafin {

std::string DraftModel::describe() const {
  if (c_.kind == DraftKind::kMtp) {
    return fmt::format(
        "MTP draft (the target's layer {}), taps {} ({}): {:.1f} MiB of weights, {} B of draft "
        "cache per position",
        c_.target_layers, fmt::join(c_.taps.layers, ","), tap_stream_name(c_.taps.stream),
        double(weight_bytes_) / (1 << 20), cache_bytes_per_position());
  }
  return fmt::format(
      "{} draft, {} layer(s), taps {} ({}){}: {:.1f} MiB of weights, {} B of "
      "draft cache per position",
      c_.kind == DraftKind::kEagle3 ? (c_.norm_output ? "EAGLE-3.1" : "EAGLE-3.0") : "DSpark",
      c_.num_layers, fmt::join(c_.taps.layers, ","), tap_stream_name(c_.taps.stream),
      c_.fc_norm ? " + fc_norm" : "", double(weight_bytes_) / (1 << 20),
      cache_bytes_per_position());
}

std::string DraftModel::state_id() const {
  std::error_code ec;
  const auto dir = std::filesystem::weakly_canonical(std::filesystem::path(c_.path), ec);
  return describe() + " @ " + (ec ? c_.path : dir.string());
}

std::shared_ptr<DraftModel> open_draft_model(const std::string& dir, const ModelConfig& target) {
  DraftModelConfig c = load_draft_config(dir);
  check_draft_matches(c, target);
  const std::string weights = (std::filesystem::path(dir) / "model.safetensors").string();
  if (!std::filesystem::exists(weights) &&
      !std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors.index.json")) {
    fail("{}: missing (a draft model folder holds config.json and model.safetensors)", weights);
  }
  std::shared_ptr<const Checkpoint> ck = Checkpoint::open(dir);
  switch (c.kind) {
    case DraftKind::kEagle3:
      return std::make_shared<Eagle3Model>(std::move(c), std::move(ck));
    case DraftKind::kDSpark:
      return std::make_shared<DSparkModel>(std::move(c), std::move(ck));
    case DraftKind::kMtp:
      break;  // never read from a folder's config.json
  }
  fail("{}: unknown drafter kind", c.path);
}

std::unique_ptr<Drafter> open_drafter(const std::string& spec, Model& target) {
  if (spec == "none" || spec == "ngram") return make_drafter(spec);
  if (!std::filesystem::is_directory(spec)) {
    fail_setting("draft", spec,
                 "expected none, ngram or a draft model folder (config.json + model.safetensors)");
  }
  return open_draft_model(spec, target.config())->new_drafter(target);
}

}  // namespace deltafin
