#include "generate/driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/sysinfo.h"
#include "core/timer.h"

namespace deltafin {

std::string describe_draft_choice(const DraftConfig& c) {
  std::string w;
  for (size_t k = 0; k < c.widths.size(); ++k) {
    if (c.widths[k] > 0)
      w += fmt::format("{}{} drafts x {}", w.empty() ? "" : ", ", k, c.widths[k]);
  }
  return fmt::format(
      "[draft] {} length; decode passes by drafts verified: {}; acceptance estimate {:.2f}; pass "
      "cost {}",
      c.auto_length ? "auto" : fmt::format("fixed {}", c.max), w.empty() ? "none" : w,
      c.acceptance.rate(), c.cost ? c.cost->describe() : "not measured");
}

uint64_t bytes_read_so_far(Model& model) {
  return model.experts().stats().bytes_read + model.trunk_stats().bytes_streamed;
}

void drive_step(Model& model, State& state, Generation& gen, DraftConfig* draft,
                const std::function<void(std::span<float>)>& adjust, const SequenceContext& ctx) {
  if (gen.finished()) return;
  if (draft != nullptr && !draft->cost) draft->cost = PassCostModel::for_model(model);
  RoundSequence seq;
  seq.state = &state;
  seq.gen = &gen;
  seq.draft = draft;
  seq.adjust = adjust;
  seq.before = ctx.before;
  seq.cut_at = ctx.cuts;
  run_round(model, std::span<RoundSequence>(&seq, 1), 0,
            draft != nullptr ? &*draft->cost : nullptr);
  if (seq.error) std::rethrow_exception(seq.error);
}

void drive(Model& model, State& state, Generation& gen, const std::atomic<bool>* cancel,
           const std::function<void(Generation&)>& on_step, DraftConfig* draft,
           const SequenceContext& ctx) {
  if (draft != nullptr && draft->drafter != nullptr) {
    draft->drafter->attach(state);
    draft->attached = &state;
  }
  while (!gen.finished()) {
    if (cancel != nullptr && cancel->load()) {
      gen.cancel();
      if (on_step) on_step(gen);
      break;
    }
    drive_step(model, state, gen, draft, {}, ctx);
    if (on_step) on_step(gen);
  }
}

StatsRecorder::StatsRecorder(Model& model)
    : model_(model),
      experts0_(model.experts().stats()),
      passes0_(model.pass_stats()),
      trunk0_(model.trunk_stats()),
      recall0_(model.prefetch_recall()) {}

RunStats StatsRecorder::finish(const Generation& g) const {
  RunStats s;
  const auto& t = g.timing();
  s.prompt_tokens = g.prompt_done();
  s.completion_tokens = static_cast<int64_t>(g.tokens().size());
  s.prefill_s = t.prefill_done > 0 ? t.prefill_done - t.start : 0;
  s.ttft_s = t.first_token > 0 ? t.first_token - t.start : 0;
  s.decode_s = s.completion_tokens > 1 ? t.last_token - t.first_token : 0;
  // The decode rate excludes prefill and the first token (it comes from the prompt's pass).
  if (s.completion_tokens > 1 && s.decode_s > 0) {
    s.decode_tokens_per_s = static_cast<double>(s.completion_tokens - 1) / s.decode_s;
    s.s_per_token = 1.0 / s.decode_tokens_per_s;
  }
  if (s.prefill_s > 0) s.prefill_tokens_per_s = static_cast<double>(s.prompt_tokens) / s.prefill_s;
  s.experts = model_.experts().stats() - experts0_;
  const TrunkStats t1 = model_.trunk_stats();
  s.trunk.bytes_streamed = t1.bytes_streamed - trunk0_.bytes_streamed;
  s.trunk.wait_s = t1.wait_s - trunk0_.wait_s;
  s.trunk.read_s = t1.read_s - trunk0_.read_s;
  const auto r1 = model_.prefetch_recall();
  uint64_t hits = 0, req = 0;
  for (size_t i = 0; i < r1.size(); ++i) {
    hits += r1[i].predicted_hits - (i < recall0_.size() ? recall0_[i].predicted_hits : 0);
    req += r1[i].requested - (i < recall0_.size() ? recall0_[i].requested : 0);
  }
  s.prefetch_recall = req > 0 ? static_cast<double>(hits) / static_cast<double>(req) : 0.0;
  s.elapsed_s = (t.last_token > 0 ? t.last_token : now_seconds()) - t.start;
  s.passes = model_.pass_stats().passes - passes0_.passes;
  s.peak_rss_bytes = peak_rss_bytes();
  s.stop_reason = stop_reason_name(g.stop_reason());
  s.seed = g.seed();
  return s;
}

nlohmann::json run_json(const std::string& model, std::span<const int32_t> prompt,
                        const Generation& gen, const RunStats& stats, bool chat) {
  nlohmann::json j;
  j["model"] = model;
  j["prompt_ids"] = std::vector<int32_t>(prompt.begin(), prompt.end());
  j["completion_ids"] = gen.completion_ids();
  j["text"] = gen.content();
  if (chat) {
    j["reasoning"] = gen.reasoning();
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : gen.tool_calls())
      calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
    j["tool_calls"] = calls;
  }
  stats.to_json(j);
  return j;
}

double RunStats::gb_per_token() const {
  const int64_t n = std::max<int64_t>(1, completion_tokens);
  return static_cast<double>(experts.bytes_read + trunk.bytes_streamed) / 1e9 /
         static_cast<double>(n);
}

void RunStats::to_json(nlohmann::json& j) const {
  j["prompt_tokens"] = prompt_tokens;
  j["reused_prompt_tokens"] = reused_tokens;
  if (!reused_from.empty()) {
    j["reused_from"] = reused_from;
    j["reuse_load_s"] = reuse_load_s;
  }
  j["completion_tokens"] = completion_tokens;
  j["prefill_s"] = prefill_s;
  j["prefill_tokens_per_s"] = prefill_tokens_per_s;
  j["ttft_s"] = ttft_s;
  j["decode_s"] = decode_s;
  j["decode_tokens_per_s"] = decode_tokens_per_s;
  j["s_per_token"] = s_per_token;
  j["stop_reason"] = stop_reason;
  j["seed"] = seed;
  j["draft_proposed"] = draft.proposed;
  j["draft_accepted"] = draft.accepted;
  j["draft_acceptance_rate"] = draft.acceptance();
  j["target_passes"] = draft.target_passes;
  j["tokens_per_pass"] = draft.tokens_per_pass();
  j["bytes_per_token"] = draft.bytes_per_token();
  j["passes"] = passes;
  j["expert_requests"] = experts.requests;
  j["expert_hits"] = experts.hits;
  j["expert_misses"] = experts.misses;
  j["expert_hit_rate"] =
      experts.requests > 0 ? static_cast<double>(experts.hits) / experts.requests : 0.0;
  j["bytes_read"] = experts.bytes_read + trunk.bytes_streamed;
  j["expert_bytes_read"] = experts.bytes_read;
  j["trunk_bytes_streamed"] = trunk.bytes_streamed;
  j["gb_per_token"] = gb_per_token();
  const double wait = experts.io_wait_s + trunk.wait_s;
  j["io_wait_s"] = wait;
  j["compute_s"] = std::max(0.0, elapsed_s - wait);
  j["elapsed_s"] = elapsed_s;
  j["read_gb_per_s"] =
      elapsed_s > 0 ? (experts.bytes_read + trunk.bytes_streamed) / 1e9 / elapsed_s : 0.0;
  j["prefetch_recall"] = prefetch_recall;
  j["prefetch_issued"] = experts.prefetch_issued;
  j["prefetch_used"] = experts.prefetch_used;
  j["prefetch_wasted_bytes"] = experts.prefetch_wasted_bytes;
  j["peak_rss_bytes"] = peak_rss_bytes;
  if (!experts.sources.empty()) j["homes"] = sources_json(experts.sources);
  j["images"] = images;
  j["image_tokens"] = image_tokens;
  j["images_encoded"] = images_encoded;
  j["vision_s"] = vision_s;
}

std::string RunStats::summary() const {
  std::string s;
  s += fmt::format(
      "[stats] prefill {} tokens in {:.3f} s ({:.1f} tokens/s){}; time to first token {:.3f} s\n",
      prompt_tokens, prefill_s, prefill_tokens_per_s,
      reused_tokens > 0 ? fmt::format(", {} reused from the kept state{}", reused_tokens,
                                      reused_from.empty() ? ""
                                                          : fmt::format(" ({} snapshot, {:.3f} s)",
                                                                        reused_from, reuse_load_s))
                        : "",
      ttft_s);
  s += fmt::format(
      "[stats] decode {} tokens in {:.3f} s: {:.2f} tokens/s, {:.4f} s/token (excludes prefill and "
      "the "
      "first token); stop: {}\n",
      std::max<int64_t>(0, completion_tokens - 1), decode_s, decode_tokens_per_s, s_per_token,
      stop_reason);
  s += fmt::format(
      "[stats] drafts {} proposed / {} accepted ({:.0f}%); {} target passes, {:.2f} tokens/pass, "
      "{:.3f} MB read per verified token\n",
      draft.proposed, draft.accepted, 100.0 * draft.acceptance(), draft.target_passes,
      draft.tokens_per_pass(), draft.bytes_per_token() / 1e6);
  const double wait = experts.io_wait_s + trunk.wait_s;
  s += fmt::format(
      "[stats] experts {} requests: {} hits, {} misses ({:.1f}% hit); read {:.3f} GB (experts "
      "{:.3f}, trunk "
      "{:.3f}) = {:.3f} GB/token at {:.2f} GB/s\n",
      experts.requests, experts.hits, experts.misses,
      experts.requests > 0 ? 100.0 * experts.hits / experts.requests : 0.0,
      (experts.bytes_read + trunk.bytes_streamed) / 1e9, experts.bytes_read / 1e9,
      trunk.bytes_streamed / 1e9, gb_per_token(),
      elapsed_s > 0 ? (experts.bytes_read + trunk.bytes_streamed) / 1e9 / elapsed_s : 0.0);
  // The router's prediction recall (of the experts a layer used, the share predicted ahead) is
  // measured whether or not a prediction had to be read: with every expert cached none is.
  s += fmt::format(
      "[stats] time {:.3f} s: I/O wait {:.3f} s, compute {:.3f} s; expert prediction recall "
      "{:.1f}%; prefetch {} issued, {} used, {:.3f} GB wasted\n",
      elapsed_s, wait, std::max(0.0, elapsed_s - wait), 100.0 * prefetch_recall,
      experts.prefetch_issued, experts.prefetch_used, experts.prefetch_wasted_bytes / 1e9);
  for (const auto& d : experts.sources) s += "[stats] " + describe_source(d) + "\n";
  if (images > 0) {
    s += fmt::format("[stats] vision {} image{} ({} image tokens): {} encoded in {:.3f} s{}\n",
                     images, images == 1 ? "" : "s", image_tokens, images_encoded, vision_s,
                     images_encoded < images ? ", the rest were in the kept state" : "");
  }
  s += fmt::format("[stats] peak RSS {:.1f} MiB", peak_rss_bytes / 1048576.0);
  return s;
}

}  // namespace deltafin
