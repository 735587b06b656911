// DeepSeek-V3's MTP layer as a drafter (`--draft mtp`, draft/mtp.h, docs/FAMILY.md §MTP):
//   - its logits on the golden case (tests/data/deepseek-v3-tiny) through `propose --draft mtp`
//     match the float64 reference's mtp_logits.f32 row by row, within the family goldens'
//     2e-3 and with the same argmax (row p: the target's final-normed hidden of position p and
//     token p+1, at RoPE position p);
//   - `run --draft mtp` gives plain decoding's greedy tokens and proposes drafts on the golden
//     model and a `make-model --preset deepseek-v3` model. Their MTP layers are random, not
//     trained, so acceptance is what it is (reported, not asserted): identity is what is proved;
//   - a conversation continued from prefix snapshots (the drafter's rows saved and restored with
//     the state) answers and drafts exactly as the same turns computed from scratch, and the
//     drafter never falls back for want of its rows;
//   - a model without an MTP layer refuses `--draft mtp` with one clear line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "draft/tap_drafter.h"
#include "runtime/load.h"
#include "runtime/sequence.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

std::string mtp_ids(std::span<const int32_t> v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::string mtp_golden_dir() {
  return test::data_dir() + "/deepseek-v3-tiny";
}

// `make-model --preset deepseek-v3` shrunk as deepseek_v3_test.cpp shrinks its presets.
const std::string& mtp_preset_model() {
  static const std::string dir = test::shared_model(
      {"--preset", "deepseek-v3", "--layers", "4", "--experts", "16", "--top-k", "4", "--hidden",
       "256", "--vocab", "512", "--shard-size", "16M", "--quiet"});
  return dir;
}

TEST(MtpDraft, LogitsMatchTheFloat64Reference) {
  const json c = json::parse(test::slurp(mtp_golden_dir() + "/case.json"));
  const auto tokens = c["tokens"].get<std::vector<int32_t>>();
  const int64_t rows = c["mtp_logits_shape"][0], V = c["mtp_logits_shape"][1];
  ASSERT_EQ(rows, static_cast<int64_t>(tokens.size()) - 1);
  const std::string raw =
      test::slurp(mtp_golden_dir() + "/" + c["mtp_logits_file"].get<std::string>());
  ASSERT_EQ(raw.size(), static_cast<size_t>(rows * V * 4));
  std::vector<float> want(raw.size() / 4);
  std::memcpy(want.data(), raw.data(), raw.size());
  const std::string out = test::temp_dir("mtp_golden") + "/logits.f32";
  // Row p: the prefix 0..p prefilled (its last hidden is h_p, rows 0..p-1 are committed into
  // the MTP cache in one batch), token p+1 the anchor, one draft.
  for (int64_t p = 0; p < rows; ++p) {
    SCOPED_TRACE("row " + std::to_string(p));
    const auto prefix = std::span<const int32_t>(tokens).first(static_cast<size_t>(p + 1));
    auto r = test::run_deltafin({"propose", "--model", mtp_golden_dir() + "/model", "--draft",
                                 "mtp", "--tokens", mtp_ids(prefix), "--anchor",
                                 std::to_string(tokens[static_cast<size_t>(p + 1)]), "--drafts",
                                 "1", "--logits-out", out, "--threads", "1", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string got_raw = test::slurp(out);
    ASSERT_EQ(got_raw.size(), static_cast<size_t>(V * 4));
    std::vector<float> got(static_cast<size_t>(V));
    std::memcpy(got.data(), got_raw.data(), got_raw.size());
    const float* e = want.data() + p * V;
    double mx = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(std::fabs(e[i] - got[i])));
    EXPECT_LE(mx, 2e-3);
    const auto best = std::max_element(e, e + V) - e;
    EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), best);
    EXPECT_EQ(json::parse(r.out)["draft_ids"], json::array({best}));
  }
}

json mtp_run(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"run", "--json", "--threads", "1"};
  full.insert(full.end(), args.begin(), args.end());
  auto r = test::run_deltafin(full);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("plain decoding for the rest"), std::string::npos) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json::object();
}

void expect_mtp_identical(const std::string& model) {
  const std::vector<std::string> base = {"--model",      model,       "--prompt-ids",
                                         "11,4,9,4,9,4", "--max-new", "20"};
  auto plain_args = base;
  plain_args.insert(plain_args.end(), {"--draft", "none"});
  const json plain = mtp_run(plain_args);
  ASSERT_EQ(plain["completion_ids"].size(), 20u) << model;
  for (const std::string k : {"1", "4", "auto"}) {
    auto args = base;
    args.insert(args.end(), {"--draft", "mtp", "--draft-max", k});
    const json j = mtp_run(args);
    EXPECT_EQ(j["completion_ids"], plain["completion_ids"]) << model << " --draft-max " << k;
    EXPECT_GT(j["draft_proposed"].get<int>(), 0) << j.dump();
    EXPECT_LE(j["draft_accepted"].get<int>(), j["draft_proposed"].get<int>());
  }
}

TEST(MtpDraft, RunIsIdenticalToPlainDecodingOnTheGoldenModel) {
  expect_mtp_identical(mtp_golden_dir() + "/model");
}

TEST(MtpDraft, RunIsIdenticalToPlainDecodingOnTheDeepseekV3Preset) {
  expect_mtp_identical(mtp_preset_model());
  // The MTP layer is counted as a draft model: -v names it.
  auto r = test::run_deltafin({"run", "--model", mtp_preset_model(), "--prompt-ids", "1,2,3",
                               "--max-new", "2", "--draft", "mtp", "-v", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("draft: MTP draft (the target's layer 4)"), std::string::npos) << r.err;
}

struct MtpTurn {
  std::vector<int32_t> answer;
  int64_t restored = 0, proposed = 0, accepted = 0;
  std::string fallback;
};

// A conversation of `turns` turns of synthetic ids, greedy, drafting with --draft-max 3; with
// `reuse` each turn continues the prefix store's snapshot of the turn before (RAM), else each
// turn is computed from scratch on a fresh state.
std::vector<MtpTurn> mtp_conversation(const std::string& model, bool reuse, int turns) {
  LoadRequest req;
  req.engine = test::engine_options(model);
  req.engine.threads = 1;
  req.draft = "mtp";
  req.draft_max = DraftMax::from_count(3);
  req.state_cache.enabled = reuse;
  req.state_cache.disk_bytes = 0;
  LoadedEngine engine = load_engine(std::move(req));
  std::unique_ptr<Drafter> holder;
  DraftConfig draft = engine.draft_config(holder);
  std::vector<int32_t> conversation;
  std::vector<MtpTurn> out;
  for (int t = 0; t < turns; ++t) {
    for (int i = 0; i < 9; ++i) conversation.push_back((t * 53 + i * 29 + 7) % 250);
    GenerationParams gp;
    gp.max_new_tokens = 12;
    draft.stats = DraftStats{};
    SequenceSpec spec;
    spec.ids = conversation;
    spec.params = gp;
    Sequence seq(*engine.model, nullptr, engine.store.get(), std::move(spec),
                 SequenceDrafter(draft));
    MtpTurn turn;
    turn.restored = seq.cached();
    seq.drive(nullptr, nullptr);
    turn.answer = seq.gen().completion_ids();
    seq.finish();
    turn.proposed = draft.stats.proposed;
    turn.accepted = draft.stats.accepted;
    turn.fallback = static_cast<TapDrafter*>(holder.get())->fallback_reason();
    conversation.insert(conversation.end(), turn.answer.begin(), turn.answer.end());
    out.push_back(std::move(turn));
  }
  return out;
}

TEST(MtpDraft, ConversationContinuedFromSnapshotsDraftsAsFromScratch) {
  const std::string model = mtp_golden_dir() + "/model";
  const auto kept = mtp_conversation(model, true, 3);
  const auto fresh = mtp_conversation(model, false, 3);
  ASSERT_EQ(kept.size(), fresh.size());
  for (size_t t = 0; t < kept.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t + 1));
    EXPECT_EQ(kept[t].answer, fresh[t].answer);
    EXPECT_EQ(kept[t].fallback, "");
    EXPECT_EQ(fresh[t].fallback, "");
    EXPECT_GT(kept[t].proposed, 0);
    EXPECT_EQ(kept[t].proposed, fresh[t].proposed);
    EXPECT_EQ(kept[t].accepted, fresh[t].accepted);
    EXPECT_EQ(fresh[t].restored, 0);
    if (t > 0) {
      EXPECT_GT(kept[t].restored, 0);  // continued from the previous turn's snapshot
    }
  }
}

TEST(MtpDraft, AModelWithoutAnMtpLayerRefusesIt) {
  const std::string model = test::data_dir() + "/k2-tiny/model";
  for (const char* cmd : {"run", "bench"}) {
    std::vector<std::string> args = {cmd, "--model", model, "--draft", "mtp"};
    if (std::string(cmd) == "run") args.insert(args.end(), {"--prompt-ids", "1,2,3"});
    auto r = test::run_deltafin(args);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(
        r.err.find("--draft mtp: " + model + " has no MTP layer (num_nextn_predict_layers is 0)"),
        std::string::npos)
        << r.err;
  }
  // "mtp" is a drafter name everywhere --draft is checked, not a folder looked up.
  auto r = test::run_deltafin({"run", "--model", model, "--prompt-ids", "1", "--draft", "mpt"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("expected none, ngram, mtp or a draft model folder"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace deltafin
