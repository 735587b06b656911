#include "model/pass_rows.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "model/pass_plan.h"

namespace deltafin {

namespace {

void check_input(const ModelConfig& c, const SequenceInput& s, const std::vector<SeqRows>& seen) {
  if (s.state == nullptr || s.tokens.empty())
    fail("forward: every sequence needs a state and at least one token");
  if (s.state->kda().size() != static_cast<size_t>(c.num_kda_layers()) ||
      s.state->mla().size() != static_cast<size_t>(c.num_mla_layers())) {
    fail("forward: state was made for a different model");
  }
  for (const auto& r : seen) {
    if (r.state == s.state) fail("forward: the same state appears twice in one pass");
  }
  if (!s.state->consistent())
    fail("forward: the state was left half-updated by a failed pass; reset it first");
  const int64_t end = s.state->position() + static_cast<int64_t>(s.tokens.size());
  if (end > c.max_positions)
    fail("sequence of {} tokens exceeds the model's context of {} positions", end, c.max_positions);
  for (int32_t t : s.tokens) {
    if (t < 0 || t >= c.vocab)
      fail("token id {} is outside the vocabulary (0..{})", t, c.vocab - 1);
  }
  if (s.embed_values.size() != s.embed_rows.size() * static_cast<size_t>(c.hidden)) {
    fail("forward: {} given embedding rows need {} values of width {}, found {}",
         s.embed_rows.size(), s.embed_rows.size() * static_cast<size_t>(c.hidden), c.hidden,
         s.embed_values.size());
  }
  for (size_t i = 0; i < s.embed_rows.size(); ++i) {
    const int64_t r = s.embed_rows[i];
    if (r < 0 || r >= static_cast<int64_t>(s.tokens.size()) ||
        (i > 0 && r <= s.embed_rows[i - 1])) {
      fail("forward: given embedding row {} is not an increasing row of the {} tokens", r,
           s.tokens.size());
    }
  }
}

}  // namespace

PassRows group_rows(const ModelConfig& c, std::span<SequenceInput> inputs) {
  PassRows p;
  for (auto& s : inputs) {
    check_input(c, s, p.seqs);
    SeqRows r;
    r.begin = p.count();
    r.count = static_cast<int64_t>(s.tokens.size());
    r.state = s.state;
    r.pending = s.pending;
    r.base = s.state->position();
    r.pass_count = r.count;
    p.tokens.insert(p.tokens.end(), s.tokens.begin(), s.tokens.end());
    for (size_t i = 0; i < s.embed_rows.size(); ++i) {
      p.given_rows.emplace_back(r.begin + s.embed_rows[i],
                                s.embed_values.data() + i * static_cast<size_t>(c.hidden));
    }
    if (s.pending != nullptr) kda_begin_pending(c, r.base, r.count, *s.pending);
    if (s.all_logits) {
      for (int64_t t = 0; t < r.count; ++t) p.logit_rows.push_back(r.begin + t);
    } else {
      p.logit_rows.push_back(r.begin + r.count - 1);
    }
    p.seqs.push_back(r);
  }
  return p;
}

int64_t PassBlock::rows() const {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.count;
  return n;
}

std::vector<PassBlock> split_blocks(const PassRows& rows, int64_t block_rows) {
  const int64_t R = rows.count();
  bool pending = false;
  for (const auto& s : rows.seqs) pending = pending || s.pending != nullptr;
  if (pending || block_rows < kPassBlockQuantum || R <= block_rows)
    return {PassBlock{0, rows.seqs}};
  std::vector<PassBlock> blocks(1);
  int64_t used = 0;  // rows in the open block
  for (const auto& s : rows.seqs) {
    for (int64_t off = 0; off < s.count;) {
      int64_t take = std::min(s.count - off, block_rows - used);
      if (take < s.count - off) take = take / kPassBlockQuantum * kPassBlockQuantum;
      if (take == 0) {  // no whole chunk fits: the rest of this sequence opens the next block
        blocks.push_back(PassBlock{blocks.back().first + used, {}});
        used = 0;
        continue;
      }
      SeqRows part = s;
      part.begin = used;
      part.count = take;
      part.base = s.base + off;
      blocks.back().seqs.push_back(part);
      used += take;
      off += take;
      if (used == block_rows && (off < s.count || &s != &rows.seqs.back())) {
        blocks.push_back(PassBlock{blocks.back().first + used, {}});
        used = 0;
      }
    }
  }
  return blocks;
}

TapCapture::TapCapture(const std::vector<SeqRows>& seqs, int64_t hidden) : H_(hidden) {
  for (const SeqRows& s : seqs) {
    TapRecorder* rec = s.state->taps();
    if (rec == nullptr) continue;
    if (rec->hidden() != hidden)
      fail("forward: a tap recorder of width {} on a model of hidden {}", rec->hidden(), hidden);
    outs_.push_back({&s, rec, rec->stage(s.base, s.count)});
  }
}

void TapCapture::take(int layer, TapStream stream, const float* x, int64_t first,
                      int64_t n_rows) const {
  for (const Out& o : outs_) {
    const TapSpec& spec = o.rec->spec();
    if (spec.stream != stream) continue;
    const int64_t n = static_cast<int64_t>(spec.layers.size());
    for (int64_t j = 0; j < n; ++j) {
      if (spec.layers[static_cast<size_t>(j)] != layer) continue;
      for (int64_t t = 0; t < o.seq->count; ++t) {
        const int64_t r = o.seq->begin + t;
        if (r < first || r - first >= n_rows) continue;
        std::memcpy(o.buf + (t * n + j) * H_, x + (r - first) * H_,
                    static_cast<size_t>(H_) * sizeof(float));
      }
    }
  }
}

bool TapCapture::wants(TapStream stream) const {
  for (const Out& o : outs_) {
    if (o.rec->spec().stream == stream) return true;
  }
  return false;
}

void TapCapture::publish() const {
  for (const Out& o : outs_) {
    if (o.seq->pending == nullptr) o.rec->publish(o.seq->count);
  }
}

}  // namespace deltafin
