// The Kimi K2 family's releases through the real binary, as a user meets them without the 1 TB
// checkpoint: `doctor --shape kimi-k2 | kimi-k2-thinking | kimi-k2.5 | deepseek-v3` forecasts the
// full release from its built-in config.json (model/released.cpp), whose sizes must come out as
// the published repositories' (Kimi-K2-Instruct-0905 1.03 TB in FP8, K2-Thinking 594 GB with INT4
// experts, DeepSeek-V3 689 GB), and a `make-model --preset k2` model decodes greedily to the same
// tokens with n-gram drafting and with its experts streamed at the minimum budget (the
// KimiLinearPreset pattern), and `serve` with that model answers an OpenAI chat request with a
// tool call in the K2 format (the turn constraint forces the named function; the K2 output parser
// hands the call back as `tool_calls`), and the four official clients with tool calls and state
// reuse across turns. Kept apart from deepseek_v3_test.cpp, which checks the
// parser, the inventory and the kernels' inputs piece by piece; this file is the user's view.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/released.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/plan.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

using nlohmann::json;

TEST(K2Release, TheBuiltInShapesAreTheReleasesConfigs) {
  const ModelConfig k2 = released_model("kimi-k2").config();
  EXPECT_EQ(k2.family, Family::kDeepseekV3);
  EXPECT_EQ(k2.model_type, "kimi_k2");
  EXPECT_EQ(k2.num_layers, 61);
  EXPECT_EQ(k2.first_k_dense, 1);
  EXPECT_EQ(k2.moe.num_experts, 384);
  EXPECT_EQ(k2.moe.num_groups, 1);
  EXPECT_FLOAT_EQ(k2.moe.routed_scaling_factor, 2.827f);
  EXPECT_EQ(k2.mla.num_heads, 64);
  EXPECT_EQ(k2.mla.rope.factor, 64.0);
  EXPECT_FLOAT_EQ(k2.rms_eps, 1e-6f);
  EXPECT_TRUE(k2.fp8_trunk);
  EXPECT_EQ(k2.expert_format(), ExpertFormat::kFP8);
  const ModelConfig thinking = released_model("kimi-k2-thinking").config();
  EXPECT_FALSE(thinking.fp8_trunk);
  EXPECT_EQ(thinking.expert_format(), ExpertFormat::kInt4);
  EXPECT_EQ(thinking.names.prefix, "");
  const ModelConfig k25 = released_model("kimi-k2.5").config();
  EXPECT_EQ(k25.model_type, "kimi_k25");
  EXPECT_EQ(k25.names.prefix, "language_model.");
  EXPECT_FLOAT_EQ(k25.rms_eps, 1e-5f);
  EXPECT_EQ(k25.expert_format(), ExpertFormat::kInt4);
  const ModelConfig ds = released_model("deepseek-v3").config();
  EXPECT_EQ(ds.model_type, "deepseek_v3");
  EXPECT_EQ(ds.first_k_dense, 3);
  EXPECT_EQ(ds.moe.num_experts, 256);
  EXPECT_EQ(ds.moe.num_groups, 8);
  EXPECT_EQ(ds.moe.topk_groups, 4);
  EXPECT_EQ(ds.mla.num_heads, 128);
  EXPECT_EQ(ds.vocab, 129280);
  EXPECT_EQ(ds.mtp_layers, 1);
  EXPECT_EQ(ds.expert_format(), ExpertFormat::kFP8);
  // Each release's config names its release (serve's default --model-id).
  for (const ReleasedModel& m : released_models())
    EXPECT_EQ(release_name_of(m.config()), m.name) << m.repo;
}

json k2_doctor_json(const std::string& shape, const std::string& dir) {
  auto r = test::run_deltafin({"doctor", "--json", "--threads", "1", "--shape", shape, "--dir", dir,
                               "--memory-budget", "64G", "--prompt-tokens", "256"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// Each release's size on disk is the published repository's, counted from the inventory of its
// config alone; a decoded token uses top-k experts in every MoE layer, measured in their format.
TEST(K2Release, DoctorForecastsTheReleasedShapes) {
  const std::string dir = test::temp_dir("k2-doctor");
  struct Want {
    const char* shape;
    int64_t experts, vocab;
    double bytes;  // the published repository's safetensors, about
    double experts_per_token;
    const char* format;
  };
  const std::vector<Want> wants = {{"kimi-k2", 384, 163840, 1.029e12, 8.0 * 60, "FP8"},
                                   {"kimi-k2-thinking", 384, 163840, 0.594e12, 8.0 * 60, "INT4"},
                                   {"deepseek-v3", 256, 129280, 0.6886e12, 8.0 * 58, "FP8"}};
  for (const Want& w : wants) {
    SCOPED_TRACE(w.shape);
    const json j = k2_doctor_json(w.shape, dir);
    EXPECT_EQ(j["model"]["layers"], 61);
    EXPECT_EQ(j["model"]["experts"], w.experts);
    EXPECT_EQ(j["model"]["top_k"], 8);
    EXPECT_EQ(j["model"]["vocab"], w.vocab);
    EXPECT_NEAR(j["model"]["weight_bytes"].get<double>(), w.bytes, 0.002e12);
    EXPECT_EQ(j["speeds"]["expert_format"], w.format);
    EXPECT_GT(j["speeds"]["mxfp4_gemv_bytes_per_s"].get<double>(), 0);
    const json& f = j["forecasts"][0];
    EXPECT_NEAR(f["experts_per_token"].get<double>(), w.experts_per_token, 1e-6);
    EXPECT_GT(f["decode_s_per_token"].get<double>(), 0);
    EXPECT_TRUE(j["ok"].get<bool>());
  }
  const auto t = test::run_deltafin({"doctor", "--threads", "1", "--shape", "kimi-k2-thinking",
                                     "--dir", dir, "--memory-budget", "64G"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  for (const char* s : {"Kimi K2 Thinking", "moonshotai/Kimi-K2-Thinking", "61 layers",
                        "384 experts", "594.21 GB needed", "INT4", "forecast",
                        "EAGLE-3.1-shaped drafter (none published for this model)"})
    EXPECT_NE(t.out.find(s), std::string::npos) << s << "\n" << t.out;
  const auto bad = test::run_deltafin({"doctor", "--shape", "kimi-k9"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("kimi-k2-thinking"), std::string::npos) << bad.err;
}

json k2_run_json(const std::vector<std::string>& args) {
  std::vector<std::string> a = {"run", "--json", "--threads", "2"};
  a.insert(a.end(), args.begin(), args.end());
  auto r = test::run_deltafin(a);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// `make-model --preset k2` (the release's widths, 3 layers, 16 experts top-4, FP8 everywhere):
// greedy decoding gives the same tokens mapped, with n-gram drafting (which must have proposed
// something, or the comparison proves nothing), and with n-gram drafting while the experts stream
// through the minimum working set of a drafted pass.
const std::string& small_k2_model() {
  static const std::string dir =
      test::shared_model({"--preset", "k2", "--layers", "3", "--experts", "16", "--top-k", "4",
                          "--hidden", "256", "--vocab", "512", "--shard-size", "16M", "--quiet"});
  return dir;
}

TEST(K2Release, K2PresetGreedyRunIsIdenticalWithDraftingAndStreaming) {
  const std::string& dir = small_k2_model();
  const std::string prompt = "11,4,9,4,9,4,11,4,9,4,9,4";
  const std::vector<std::string> base = {"--model",   dir,  "--prompt-ids", prompt,
                                         "--max-new", "24", "--mmap"};
  const json plain = k2_run_json(base);
  ASSERT_EQ(plain["completion_ids"].size(), 24u);
  EXPECT_EQ(plain["draft_proposed"], 0);
  auto with = [&](std::vector<std::string> extra, bool mmap) {
    std::vector<std::string> a = {"--model", dir, "--prompt-ids", prompt, "--max-new", "24"};
    if (mmap) a.push_back("--mmap");
    a.insert(a.end(), extra.begin(), extra.end());
    return k2_run_json(a);
  };
  const json ngram = with({"--draft", "ngram"}, true);
  EXPECT_EQ(ngram["completion_ids"], plain["completion_ids"]);
  EXPECT_GT(ngram["draft_proposed"].get<int>(), 0) << "n-gram drafting proposed nothing";
  // The minimum working set for the rows a drafted pass may have.
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions po;
  po.budget = 1ull << 40;
  po.shape.max_rows = 256;
  po.expert_slot_bytes =
      ExpertStore::slot_bytes_for(ExpertDirectory(c, *ck, ExpertFormat::kFP8), c);
  const uint64_t min = plan_memory(c, *ck, po).min_working_set;
  const std::string budget = std::to_string((min + 1023) / 1024) + "K";
  const json streamed = with({"--memory-budget", budget}, false);
  EXPECT_EQ(streamed["completion_ids"], plain["completion_ids"]);
  EXPECT_GT(streamed["expert_misses"].get<int>(), 0);
  const json both = with({"--memory-budget", budget, "--draft", "ngram"}, false);
  EXPECT_EQ(both["completion_ids"], plain["completion_ids"]);
  EXPECT_GT(both["draft_proposed"].get<int>(), 0);
  EXPECT_GT(both["expert_misses"].get<int>(), 0);
}

// The make-model's tokenizer has K2's names, so the folder speaks K2-Instruct's chat format; a
// named tool_choice is enforced by the K2 turn constraint and comes back as an OpenAI tool call
// whose arguments satisfy the function's schema. A bias on the closing characters keeps the
// random model's arguments short.
TEST(K2Release, ServeAnswersAnOpenAIChatWithAToolCall) {
  const std::string& dir = small_k2_model();
  const Tokenizer tok = Tokenizer::load(dir);
  ASSERT_EQ(tok.chat_format(), ChatFormat::k2_instruct);
  test::json bias = test::json::object();
  for (const char* text : {"\"", "}"}) {
    const auto ids = tok.encode_ordinary(text);
    if (ids.size() == 1) bias[std::to_string(ids[0])] = 5;
  }
  for (const char* name : {"<|tool_call_end|>", "<|tool_calls_section_end|>", "<|im_end|>"})
    bias[std::to_string(tok.special_id(name).value())] = 5;
  test::ServerProcess srv({"--threads", "2"}, dir);
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto cli = srv.client();
  // Without --model-id the server names the release the folder belongs to.
  const auto models = test::get(*cli, "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "kimi-k2") << models.body;
  const test::json params = {{"type", "object"},
                             {"properties", {{"city", {{"type", "string"}, {"maxLength", 8}}}}},
                             {"required", test::json::array({"city"})},
                             {"additionalProperties", false}};
  const test::json body = {
      {"messages", test::json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
      {"tools",
       test::json::array({{{"type", "function"},
                           {"function", {{"name", "get_weather"}, {"parameters", params}}}}})},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
      {"max_tokens", 200},
      {"temperature", 0},
      {"logit_bias", bias}};
  const auto r = test::post_json(*cli, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const test::json& choice = r.j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.body;
  const test::json& calls = choice["message"]["tool_calls"];
  ASSERT_TRUE(calls.is_array() && calls.size() == 1) << r.body;
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  const json args =
      json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << r.body;
  ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << r.body;
  EXPECT_LE(args["city"].get<std::string>().size(), 8u * 4) << r.body;  // 8 characters, UTF-8
  EXPECT_EQ(args.size(), 1u) << r.body;
}

// The Anthropic, OpenAI (Chat Completions and Responses) and Ollama clients, installed from npm
// by tests/api_clients' lockfile, against `serve` with the K2 make-model: a forced tool call in
// each API's shape, and a second turn that sends the call and its result back and prefills only
// what the client added; answers equal to a server that reuses nothing (server_util.h).
TEST(K2Release, EveryClientCallsToolsAndContinuesFromTheKeptState) {
  test::expect_family_clients_reuse_state(small_k2_model(), "kimi-k2");
}

}  // namespace
}  // namespace deltafin
