// Speculative verification, the one accept loop and the drafters that need no model. Kept free
// of the model's internals: it uses only Model::forward with a PendingCommit and Model::commit,
// so the exact engine is untouched and the output cannot differ from plain decoding (see
// speculative.h).
#include "generate/speculative.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"
#include "generate/driver.h"
#include "generate/generation.h"
#include "model/model.h"

namespace deltafin {

DraftProposal NgramDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  DraftProposal out;
  const int64_t h = static_cast<int64_t>(history.size());
  if (max_tokens <= 0) return out;
  for (int n = std::min<int64_t>(max_n_, h - 1); n >= min_n_; --n) {
    const auto tail = history.subspan(h - n);
    // Most recent earlier occurrence whose continuation exists.
    for (int64_t start = h - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), history.begin() + start)) continue;
      for (int64_t i = start + n; i < h && static_cast<int>(out.tokens.size()) < max_tokens; ++i)
        out.tokens.push_back(history[i]);
      return out;
    }
  }
  return out;
}

ReplayDrafter::ReplayDrafter(std::vector<int32_t> known, int wrong_every, int64_t vocab)
    : known_(std::move(known)), wrong_every_(wrong_every), vocab_(vocab) {}

DraftProposal ReplayDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  DraftProposal out;
  const int64_t h = static_cast<int64_t>(history.size());
  const int64_t n = static_cast<int64_t>(known_.size());
  // Where the history stands in the known sequence: its longest tail (up to 16 tokens) that
  // occurs there, latest occurrence first; a history that is a prefix of it matches at once.
  int64_t at = -1;
  if (h <= n && std::equal(history.begin(), history.end(), known_.begin())) at = h;
  for (int64_t len = std::min<int64_t>(16, h); at < 0 && len >= 1; --len) {
    const auto tail = history.subspan(static_cast<size_t>(h - len));
    for (int64_t start = n - len; start >= 0; --start) {
      if (std::equal(tail.begin(), tail.end(), known_.begin() + start)) {
        at = start + len;
        break;
      }
    }
  }
  if (at < 0) return out;
  for (int64_t i = at; i < n && static_cast<int>(out.tokens.size()) < max_tokens; ++i) {
    int32_t t = known_[static_cast<size_t>(i)];
    ++count_;
    if (wrong_every_ > 0 && count_ % wrong_every_ == 0)
      t = static_cast<int32_t>((t + 1) % std::max<int64_t>(1, vocab_));
    out.tokens.push_back(t);
  }
  return out;
}

namespace {
std::unique_ptr<Drafter> make_replay(const std::string& spec, const DrafterContext& ctx) {
  // replay:FILE or replay/N:FILE
  const size_t colon = spec.find(':');
  int wrong = 0;
  if (spec[6] == '/') {
    const std::string n = spec.substr(7, colon == std::string::npos ? 0 : colon - 7);
    if (n.empty() || n.size() > 6 || !std::all_of(n.begin(), n.end(), ::isdigit))
      fail_setting("draft", spec, "expected replay/N:FILE with N a number");
    wrong = std::stoi(n);
  }
  if (colon == std::string::npos || colon + 1 == spec.size())
    fail_setting("draft", spec, "expected replay:FILE (a file of token ids)");
  const std::string file = spec.substr(colon + 1);
  std::string text;
  try {
    text = read_file(file);
  } catch (const std::exception& e) {
    fail_setting("draft", spec, "cannot read the replay file: {}", e.what());
  }
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',' || text[i] == '[' ||
        text[i] == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i || j - i > 9)
      fail_setting("draft", spec, "{} holds '{}' where a token id was expected", file,
                   text.substr(i, 16));
    const int64_t id = std::stoll(text.substr(i, j - i));
    if (ctx.vocab > 0 && id >= ctx.vocab)
      fail_setting("draft", spec, "token id {} is outside the vocabulary of {}", id, ctx.vocab);
    ids.push_back(static_cast<int32_t>(id));
    i = j;
  }
  if (ids.empty()) fail_setting("draft", spec, "{} holds no token ids", file);
  return std::make_unique<ReplayDrafter>(std::move(ids), wrong, ctx.vocab);
}
}  // namespace

std::unique_ptr<Drafter> make_drafter(const std::string& spec, const DrafterContext& ctx) {
  if (spec == "none") return nullptr;
  if (spec == "ngram") return std::make_unique<NgramDrafter>();
  if (spec == "mtp") {
    // The model's own MTP layer (DeepSeek-V3): opened by the load path, which knows the model.
    if (ctx.model == nullptr) return nullptr;
    fail_setting("draft", spec,
                 "the MTP drafter is opened once by the load path (runtime/load.h), not per "
                 "sequence");
  }
  if (spec.rfind("replay:", 0) == 0 || spec.rfind("replay/", 0) == 0) return make_replay(spec, ctx);
  std::error_code ec;
  if (std::filesystem::is_directory(spec, ec)) {
    const std::filesystem::path config = std::filesystem::path(spec) / "config.json";
    if (!std::filesystem::exists(config, ec))
      fail_setting("draft", spec,
                   "no config.json (expected a draft model folder: config.json + "
                   "model.safetensors)");
    require_regular_file(config.string());     // a FIFO or a folder named config.json
    if (ctx.model == nullptr) return nullptr;  // checked; opened by the load path
    fail_setting("draft", spec,
                 "a draft model folder is opened once by the load path (runtime/load.h), not "
                 "per sequence");
  }
  fail_setting("draft", spec,
               "unknown drafter (expected none, ngram, mtp or a draft model folder)");
}

DraftStats& DraftStats::operator+=(const DraftStats& o) {
  proposed += o.proposed;
  accepted += o.accepted;
  target_passes += o.target_passes;
  tokens += o.tokens;
  bytes_read += o.bytes_read;
  return *this;
}

RowsVerdict accept_rows(Generation& gen, std::span<float> logits, int64_t vocab,
                        const DraftProposal& d,
                        const std::function<void(std::span<float>)>& adjust) {
  RowsVerdict v;
  const size_t k = d.tokens.size();
  const size_t before = gen.tokens().size();
  for (size_t i = 0; i <= k; ++i) {
    std::span<float> row =
        logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    if (adjust) adjust(row);
    bool accepted = false;
    if (i < k) {
      accepted = gen.on_draft_logits(
          row, d.tokens[i],
          i < d.q.size() ? std::span<const float>(d.q[i]) : std::span<const float>());
    } else {
      gen.on_logits(row);
    }
    ++v.fed;
    if (accepted) ++v.accepted;
    if (!accepted || gen.finished()) break;
  }
  v.tokens = static_cast<int64_t>(gen.tokens().size() - before);
  return v;
}

}  // namespace deltafin
