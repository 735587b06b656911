// Opening a draft model: the one entry point the surfaces call (`--draft DIR|ngram|none`).
// A DraftModel is the loaded, immutable part (config, mapped weights), shared by every
// sequence; new_drafter() gives a sequence its own Drafter with its own draft cache. A folder's
// kind comes from its config.json (EAGLE-3/3.1 or DSpark); "none" and "ngram" are generate's
// make_drafter. The draft's tensors are mapped read-only through the storage layer's
// Checkpoint, the same loader as the target's, so a truncated or corrupt file is refused the
// same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "draft/draft_config.h"
#include "draft/draft_layers.h"
#include "generate/speculative.h"
#include "model/model.h"

namespace deltafin {

class TapDrafter;

class DraftModel : public std::enable_shared_from_this<DraftModel> {
 public:
  virtual ~DraftModel() = default;
  const DraftModelConfig& config() const { return c_; }
  // Bytes of the draft's own tensors (K3's embedding, and DSpark's use of K3's head, excluded).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Draft-cache bytes per committed position of one sequence.
  virtual uint64_t cache_bytes_per_position() const = 0;
  // A drafter for one sequence of `target` (the model this draft was checked against).
  virtual std::unique_ptr<TapDrafter> new_drafter(Model& target) const = 0;
  // One line for -v: kind, layers, taps, bytes.
  std::string describe() const;
  // What its cache rows mean, for prefix snapshots: the description and the folder.
  std::string state_id() const;

 protected:
  explicit DraftModel(DraftModelConfig c) : c_(std::move(c)) {}
  // new_drafter's body for drafter type D over model type M (the target is checked first).
  template <class D, class M>
  std::unique_ptr<TapDrafter> drafter_for(Model& target) const {
    check_draft_matches(c_, target.config());
    return std::make_unique<D>(target, std::static_pointer_cast<const M>(shared_from_this()));
  }
  DraftModelConfig c_;
  uint64_t weight_bytes_ = 0;
};

// What EAGLE-3 and DSpark models hold beside their config: the checkpoint their weights point
// into, the bound weights (`Weights`, each kind's own struct) and the YaRN tables of their
// rotated dims.
template <class Weights>
class TapDraftModel : public DraftModel {
 public:
  const Weights& weights() const { return w_; }
  const Yarn& yarn() const { return yarn_; }

 protected:
  TapDraftModel(DraftModelConfig c, std::shared_ptr<const Checkpoint> ck)
      : DraftModel(std::move(c)), ck_(std::move(ck)), yarn_(c_.yarn, c_.mla.qk_rope_dim) {}
  std::shared_ptr<const Checkpoint> ck_;
  Weights w_;
  Yarn yarn_;
};

// Opens a draft folder for `target`; throws Error with one line naming what does not fit.
std::shared_ptr<DraftModel> open_draft_model(const std::string& dir, const ModelConfig& target);
// `spec`: "none" (nullptr), "ngram", or a draft folder.
std::unique_ptr<Drafter> open_drafter(const std::string& spec, Model& target);

}  // namespace deltafin
