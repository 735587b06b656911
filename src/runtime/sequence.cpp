// One generation's life (see sequence.h).
#include "runtime/sequence.h"

#include "core/timer.h"

namespace deltafin {

SequenceDrafter::SequenceDrafter(std::unique_ptr<Drafter> own, const DraftMax& max)
    : own_(std::move(own)) {
  own_config_.drafter = own_.get();
  own_config_.set_max(max);
}

namespace {

State* state_for(Model& model, State& own, State* kept) {
  if (kept != nullptr) return kept;
  own = model.new_state();
  return &own;
}

}  // namespace

Sequence::Sequence(Model& model, const Tokenizer* tok, PrefixStore* store, SequenceSpec spec,
                   SequenceDrafter drafter, State* kept_state, bool record_stats)
    : model_(model),
      spec_(std::move(spec)),
      key_(state_key_ids(spec_.ids, spec_.images)),
      drafting_(std::move(drafter)),
      draft_(drafting_.kept_ != nullptr ? drafting_.kept_ : &drafting_.own_config_),
      state_(state_for(model, own_state_, kept_state)),
      reuse_(store, key_, spec_.marks, *state_, draft_->drafter),
      cached_(state_->position()) {
  // Images after the reused prefix are encoded now (the rows stay until the prompt is in).
  if (!spec_.images.empty()) {
    image_rows_ = encode_prompt_images(spec_.vision, spec_.ids, spec_.images, cached_,
                                       model.config().hidden, &image_stats_);
  }
  const auto before = std::span<const int32_t>(spec_.ids).first(static_cast<size_t>(cached_));
  gen_ = std::make_unique<Generation>(std::vector<int32_t>(input().begin(), input().end()),
                                      spec_.params, tok, model.config().vocab, before);
  if (record_stats) recorder_.emplace(model);
  timings_.admitted = now_seconds();
  timings_.arrived = spec_.arrived > 0 ? spec_.arrived : timings_.admitted;
  timings_.drafting = draft_->drafter != nullptr;
}

RoundSequence Sequence::round_entry(
    std::function<void(const Generation&, std::span<float>)> extra) {
  RoundSequence r;
  r.state = state_;
  r.gen = gen_.get();
  r.before = std::span<const int32_t>(spec_.ids).first(static_cast<size_t>(cached_));
  r.draft = draft_;
  if (!spec_.logit_bias.empty() || extra) {
    r.adjust = [this, extra = std::move(extra)](std::span<float> row) {
      for (const auto& [id, bias] : spec_.logit_bias) row[static_cast<size_t>(id)] += bias;
      if (extra) extra(*gen_, row);
    };
  }
  r.cut_at = reuse_.cuts();
  if (!image_rows_.empty()) r.embed = &image_rows_;
  return r;
}

void Sequence::after_pass() {
  // A prefill pass that reached a cut, or that ended where the pass plan cut the prompt after a
  // long stretch, is kept (prefix/reuse.h); a decode pass is past the prompt and keeps nothing.
  reuse_.after_pass(key_, *state_, draft_->drafter, gen_->in_prefill());
}

void Sequence::step() {
  if (gen_->finished()) return;
  if (!draft_->cost) draft_->cost = PassCostModel::for_model(model_);
  RoundSequence r = round_entry();
  run_round(model_, std::span<RoundSequence>(&r, 1), 0, &*draft_->cost);
  if (r.error) std::rethrow_exception(r.error);
  after_pass();
}

void Sequence::drive(const std::atomic<bool>* cancel,
                     const std::function<void(Generation&)>& on_step) {
  // A conversation's drafter follows this state from here (a new state restarts its cache).
  if (draft_->drafter != nullptr) {
    draft_->drafter->attach(*state_);
    draft_->attached = state_;
  }
  while (!gen_->finished()) {
    if (cancel != nullptr && cancel->load()) {
      gen_->cancel();
      if (on_step) on_step(*gen_);
      break;
    }
    step();
    if (on_step) on_step(*gen_);
  }
}

void Sequence::finish(std::optional<std::span<const int32_t>> consumed) {
  timings_.finished = now_seconds();
  if (gen_->stop_reason() == StopReason::kCancelled) return;
  if (consumed) {
    reuse_.at_end(state_key_ids(*consumed, spec_.images), *state_, draft_->drafter);
    return;
  }
  std::vector<int32_t> ids = key_;
  const auto completion = gen_->completion_ids();
  ids.insert(ids.end(), completion.begin(), completion.end());
  if (gen_->unconsumed_token()) ids.pop_back();
  reuse_.at_end(ids, *state_, draft_->drafter);
}

Usage Sequence::usage() const {
  Usage u;
  const Generation& g = *gen_;
  u.cached_tokens = cached_;
  u.prompt_tokens = cached_ + g.prompt_size();
  u.completion_tokens = static_cast<int64_t>(g.tokens().size());
  u.constraint_unfinished = g.constraint_unfinished();
  u.stopped_in_prefill = g.in_prefill();
  u.prompt_prefilled = cached_ + g.prompt_done();
  u.timings = timings_;
  u.timings.first_token = g.timing().first_token;
  if (u.timings.finished == 0) u.timings.finished = now_seconds();
  if (cached_ > 0 && restored().position > 0) {
    u.cached_from = restored().where();
    u.cached_load_s = restored().seconds;
  }
  const DraftStats& d = draft_->stats;
  u.timings.draft_n = d.proposed;
  u.timings.draft_n_accepted = d.accepted;
  u.timings.target_passes = d.target_passes;
  u.timings.decode_tokens = d.tokens;
  u.images = image_stats_.images;
  u.images_encoded = image_stats_.encoded;
  u.vision_s = image_stats_.seconds;
  return u;
}

RunStats Sequence::run_stats() const {
  RunStats s = recorder_ ? recorder_->finish(*gen_) : RunStats{};
  s.reused_tokens = cached_;
  if (restored().position > 0) {
    s.reused_from = restored().where();
    s.reuse_load_s = restored().seconds;
  }
  s.draft = draft_->stats;
  s.images = image_stats_.images;
  s.image_tokens = image_stats_.tokens;
  s.images_encoded = image_stats_.encoded;
  s.vision_s = image_stats_.seconds;
  return s;
}

}  // namespace deltafin
