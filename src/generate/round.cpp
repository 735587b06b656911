// The one round (see round.h).
#include "generate/round.h"

#include <algorithm>
#include <future>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "generate/generation.h"
#include "model/model.h"

namespace deltafin {

DraftMax DraftMax::parse(const std::string& text) {
  if (text == "auto") return {};
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    fail_setting("draft max", text, "expected auto or a number of drafts");
  if (n < 1 || n > 256)
    fail_setting("draft max", text,
                 "expected auto or a number of drafts, at least 1 and at most 256");
  return {false, static_cast<int>(n)};
}

DraftMax DraftMax::from_count(int64_t n) {
  if (n == 0) return {};
  if (n < 1 || n > 256)
    fail_setting("draft max", std::to_string(n),
                 "expected 0 (auto) or a number of drafts, at least 1 and at most 256");
  return {false, static_cast<int>(n)};
}

namespace {

struct RoundPlanned {
  bool skip = true;  // finished, or no room in this pass
  DraftProposal drafts;
  std::vector<int32_t> proposal;  // the drafter's proposal before the length cut
  std::vector<int32_t> rows;      // [input, drafts] of a verify pass
  PendingCommit pending;
  bool decoding = false;
  std::vector<int64_t> embed_rows;  // this pass's rows whose embedding is given (s.embed)
};

// The given rows (images) among the pass's rows of `s`: rows [0, n) are positions
// [state position, + n).
void round_embed(const RoundSequence& s, RoundPlanned& p, size_t n, SequenceInput& in) {
  if (s.embed == nullptr || s.embed->empty()) return;
  const auto& pos = s.embed->positions;
  const int64_t begin = s.state->position();
  const int64_t end = begin + static_cast<int64_t>(n);
  const auto lo = std::lower_bound(pos.begin(), pos.end(), begin);
  const auto hi = std::lower_bound(lo, pos.end(), end);
  if (lo == hi) return;
  p.embed_rows.clear();
  for (auto it = lo; it != hi; ++it) p.embed_rows.push_back(*it - begin);
  const size_t first = static_cast<size_t>(lo - pos.begin());
  const size_t w = static_cast<size_t>(s.embed->width);
  in.embed_rows = p.embed_rows;
  in.embed_values =
      std::span<const float>(s.embed->values).subspan(first * w, p.embed_rows.size() * w);
}

// The history a drafter proposes from: every id the sequence consumed, then the anchor.
std::vector<int32_t> round_history(const RoundSequence& s) {
  std::vector<int32_t> h(s.before.begin(), s.before.end());
  h.insert(h.end(), s.gen->prompt().begin(), s.gen->prompt().end());
  for (const int32_t t : s.gen->completion_ids()) h.push_back(t);
  return h;
}

// Cuts the prompt input at the next cut position after the state's.
void round_cut_prompt(RoundSequence& s) {
  const int64_t at = s.state->position();
  const auto next = std::upper_bound(s.cut_at.begin(), s.cut_at.end(), at);
  if (next != s.cut_at.end()) s.gen->limit_input(*next - at);
}

void round_cut_drafts(DraftProposal& d, size_t k) {
  d.tokens.resize(k);
  if (d.q.size() > k) d.q.resize(k);
  if (d.confidence.size() > k) d.confidence.resize(k);
}

// A constrained sequence's drafts, advanced through a copy of its matcher, end at the first
// token the grammar refuses (docs/STRUCTURED-OUTPUT.md): verifying past it is wasted rows, since
// the masked target gives it probability 0. A deterministic drafter (no q) loses it too: the
// target samples that row from the masked distribution as a plain pass would. A drafter that
// draws from q keeps it as its last draft, so rejection sampling rejects it with certainty and
// draws from the residual max(0, p - q), exactly as without the cut (cutting it would replace
// that residual by p and bias the output).
void round_cut_constrained(const Generation& gen, DraftProposal& d) {
  const size_t ok = gen.allowed_drafts(d.tokens);
  if (ok >= d.tokens.size()) return;
  round_cut_drafts(d, d.q.empty() ? ok : ok + 1);
}

// Step 2 for one decoding sequence: its proposal, cut to its room.
void round_propose(RoundSequence& s, RoundPlanned& p) {
  DraftConfig& d = *s.draft;
  // Drafts past the token limit could never be emitted; auto asks for what may be accepted.
  int room = static_cast<int>(std::min<int64_t>(d.max, s.gen->tokens_left() - 1));
  if (d.auto_length) room = auto_draft_room(room, d.acceptance.rate());
  if (room <= 0) return;
  try {
    TraceSpan span("propose", "draft", {{"room", room}});
    p.drafts = d.drafter->propose(round_history(s), room);
  } catch (const std::exception& e) {
    // A drafter that fails costs this sequence its drafts, never its output.
    log_warn("drafter failed: {}", e.what());
    p.drafts = DraftProposal{};
  }
  if (static_cast<int>(p.drafts.tokens.size()) > room)
    p.drafts.tokens.resize(static_cast<size_t>(room));
  p.proposal = p.drafts.tokens;
  round_cut_constrained(*s.gen, p.drafts);
}

// A drafter reads its sequence's taps from the first pass on the state (prefill included).
void round_attach(RoundSequence& s) {
  if (s.draft == nullptr || s.draft->drafter == nullptr || s.draft->attached == s.state) return;
  s.draft->drafter->attach(*s.state);
  s.draft->attached = s.state;
}

// Step 4 for one sequence of the pass.
void round_take_rows(Model& model, RoundSequence& s, RoundPlanned& p, std::span<float> logits,
                     RoundReport& r) {
  TraceSpan span("sample", "generate", {{"drafts", p.drafts.tokens.size()}});
  Generation& gen = *s.gen;
  const size_t before = gen.tokens().size();
  const RowsVerdict v =
      accept_rows(gen, logits, model.config().vocab, p.drafts, s.adjust ? s.adjust : nullptr);
  const int proposed = static_cast<int>(p.drafts.tokens.size());
  if (proposed > 0) {
    model.commit(*s.state, p.pending, v.fed);
    s.draft->drafter->on_verified(proposed, v.accepted);
  }
  s.emitted = static_cast<int64_t>(gen.tokens().size() - before);
  r.generated += s.emitted;
  if (!p.decoding) return;
  ++r.decode_sequences;
  r.decode_tokens += s.emitted;
  r.proposed += proposed;
  r.accepted += v.accepted;
  if (s.draft == nullptr) return;
  DraftConfig& d = *s.draft;
  if (!p.proposal.empty()) {
    std::vector<int32_t> emitted;
    for (size_t t = before; t < gen.tokens().size(); ++t) emitted.push_back(gen.tokens()[t].id);
    d.acceptance.observe_pass(p.proposal, proposed, v.accepted, emitted);
  }
  if (d.drafter != nullptr) {
    if (d.widths.size() <= static_cast<size_t>(proposed))
      d.widths.resize(static_cast<size_t>(proposed) + 1);
    ++d.widths[static_cast<size_t>(proposed)];
  }
  ++d.stats.target_passes;
  d.stats.proposed += proposed;
  d.stats.accepted += v.accepted;
  d.stats.tokens += s.emitted;
}

// Step 3's side work: the cold mask work of the constrained sequences in the pass, started on a
// helper thread so it runs while the forward pass does. Only cold nodes are handed over: a warm
// mask is a bitset union, cheaper than the hand-over. A node that fails to compute there (out
// of memory) is simply computed again by accept_rows, where its error belongs to its sequence;
// no thread to be had means no overlap, not an error.
std::future<void> round_start_masks(std::span<RoundSequence> seqs, std::span<RoundPlanned> plan,
                                    std::span<const size_t> in_pass, RoundReport& r) {
  std::vector<grammar::ColdNodes> cold;
  for (const size_t i : in_pass) {
    grammar::ColdNodes c = seqs[i].gen->cold_mask_nodes(plan[i].drafts.tokens);
    if (c.nodes.empty()) continue;
    r.mask_nodes_overlapped += static_cast<int64_t>(c.nodes.size());
    cold.push_back(std::move(c));
  }
  if (cold.empty()) return {};
  try {
    return std::async(std::launch::async, [cold = std::move(cold)] {
      for (const auto& c : cold) c.compute();
    });
  } catch (const std::system_error&) {
    r.mask_nodes_overlapped = 0;
    return {};
  }
}

}  // namespace

RoundReport run_round(Model& model, std::span<RoundSequence> seqs, int64_t pass_rows,
                      PassCostModel* cost) {
  TraceSpan round_span("round", "generate", {{"sequences", seqs.size()}});
  RoundReport r;
  std::vector<RoundPlanned> plan(seqs.size());
  // 1. Rows: decoding sequences first, then prompts in order while the pass has room.
  int64_t rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    RoundSequence& s = seqs[i];
    s.in_pass = false;
    s.emitted = 0;
    s.error = nullptr;
    if (s.gen->finished() || s.gen->next_input().empty() || s.gen->in_prefill()) continue;
    plan[i].skip = false;
    plan[i].decoding = true;
    rows += static_cast<int64_t>(s.gen->next_input().size());
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    RoundSequence& s = seqs[i];
    if (s.gen->finished() || !s.gen->in_prefill()) continue;
    round_cut_prompt(s);
    if (pass_rows > 0) {
      const int64_t room = pass_rows - rows;
      if (room <= 0) continue;
      s.gen->limit_input(room);
    }
    plan[i].skip = false;
    rows += static_cast<int64_t>(s.gen->next_input().size());
    r.prompt_rows += static_cast<int64_t>(s.gen->next_input().size());
  }
  // 2. Drafts.
  std::vector<size_t> who;
  std::vector<std::vector<double>> expected;
  for (size_t i = 0; i < seqs.size(); ++i) {
    RoundSequence& s = seqs[i];
    if (plan[i].skip || !plan[i].decoding || s.draft == nullptr || s.draft->drafter == nullptr)
      continue;
    round_attach(s);
    round_propose(s, plan[i]);
    if (s.draft->auto_length && !plan[i].drafts.tokens.empty()) {
      who.push_back(i);
      expected.push_back(expected_tokens(plan[i].drafts, s.draft->acceptance.rate()));
    }
  }
  if (!who.empty() && cost != nullptr) {
    const std::vector<int> k = choose_draft_lengths(expected, rows, *cost);
    for (size_t j = 0; j < who.size(); ++j)
      round_cut_drafts(plan[who[j]].drafts, static_cast<size_t>(k[j]));
  }
  // 3. The pass.
  std::vector<SequenceInput> inputs;
  std::vector<size_t> in_pass;
  rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (plan[i].skip) continue;
    RoundSequence& s = seqs[i];
    round_attach(s);
    RoundPlanned& p = plan[i];
    const auto in = s.gen->next_input();
    if (p.drafts.tokens.empty()) {
      inputs.push_back({s.state, in, false, nullptr});
      rows += static_cast<int64_t>(in.size());
    } else {
      p.rows.assign(in.begin(), in.end());
      p.rows.insert(p.rows.end(), p.drafts.tokens.begin(), p.drafts.tokens.end());
      inputs.push_back({s.state, p.rows, true, &p.pending});
      rows += static_cast<int64_t>(p.rows.size());
    }
    round_embed(s, p, inputs.back().tokens.size(), inputs.back());
    s.in_pass = true;
    in_pass.push_back(i);
  }
  if (inputs.empty()) return r;
  r.ran = true;
  r.rows = rows;
  r.sequences = static_cast<int64_t>(inputs.size());
  const uint64_t bytes0 = model.experts().stats().bytes_read + model.trunk_stats().bytes_streamed;
  std::vector<float> logits;
  Stopwatch sw;
  std::future<void> masks = round_start_masks(seqs, plan, in_pass, r);
  try {
    // A decode pass with more rows than sequences carries drafts: it verifies them.
    TraceSpan pass_span(r.prompt_rows > 0 ? "prefill" : (rows > r.sequences ? "verify" : "decode"),
                        "generate", {{"rows", rows}, {"prompt_rows", r.prompt_rows}});
    logits = model.forward(inputs);
    if (masks.valid()) masks.wait();
  } catch (...) {
    if (masks.valid()) masks.wait();
    r.failure = std::current_exception();
    for (const size_t i : in_pass) {
      seqs[i].gen->abort();
      seqs[i].error = r.failure;
    }
    return r;
  }
  r.seconds = sw.elapsed();
  r.bytes_read = model.experts().stats().bytes_read + model.trunk_stats().bytes_streamed - bytes0;
  if (r.prompt_rows == 0 && cost != nullptr) cost->observe(rows, r.seconds);
  // 4. Each sequence's rows.
  const size_t vocab = static_cast<size_t>(model.config().vocab);
  size_t offset = 0;  // this sequence's first logit row
  for (const size_t i : in_pass) {
    RoundSequence& s = seqs[i];
    RoundPlanned& p = plan[i];
    const size_t n = p.drafts.tokens.size() + 1;
    std::span<float> l(logits.data() + offset * vocab, n * vocab);
    offset += n;
    try {
      round_take_rows(model, s, p, l, r);
    } catch (...) {
      s.gen->abort();
      s.error = std::current_exception();
      continue;
    }
    if (p.decoding && s.draft != nullptr && r.sequences == 1)
      s.draft->stats.bytes_read += r.bytes_read;
  }
  return r;
}

}  // namespace deltafin
