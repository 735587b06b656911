// Regression tests for issue 31 parts B and C (the rough edges of a new user's first hour and
// an adversarial pass over the newer surfaces), each through the surface the user meets: the
// real `deltafin` binary, the server's request parser, the draft config reader. The Python
// crashes of part C are tested through the package itself (python/tests).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "draft/draft_config.h"
#include "engine/engine.h"
#include "generate/generation.h"
#include "generate/generation_config.h"
#include "model/config.h"
#include "server/request.h"
#include "server/response.h"
#include "server_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// The synthetic tiny model every server and surface test shares (server_util.h).
const std::string& tiny_model() {
  return test::server_model_dir();
}

std::string source_root() {
  return std::string(DELTAFIN_TEST_DATA) + "/../..";
}

// The demo model in a cache folder of this test's own (so the first-use install is exercised
// without touching the user's cache).
void use_private_cache(const std::string& name) {
  ::setenv("DELTAFIN_CACHE", test::temp_dir(name).c_str(), 1);
  ::unsetenv("DELTAFIN_MODEL");
}

// ------------------------------------------------------------------------------------------
// B1: a system message that declares tools and has no content is K3's dynamic tool
// declaration; request validation accepts it (render and the server), and still refuses a
// system message with neither.

TEST(RoughEdges, SystemMessageWithToolsAndNoContentIsAccepted) {
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "lookup"}, {"description", "Find it"}}}}});
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}},
                                               {{"role", "system"}, {"tools", tools}}})},
                     {"thinking", false}};
  const std::string dir = test::temp_dir("edges-b1");
  test::spit(dir + "/req.json", body.dump());
  auto r = test::run_deltafin(
      {"render", "--model", test::data_dir() + "/tokenizer", "--request", dir + "/req.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("type=\"tool-declare\"<|sep|>## New Tools Available"), std::string::npos)
      << r.out;
  // The server's parser (every API's requests go through it).
  const auto req =
      server::parse_chat_request(body, test::k3_limits(4096, 4096), test::k3_tokenizer());
  EXPECT_FALSE(req.prompt.empty());
  // Neither content nor tools: still refused, naming the field.
  json bare = body;
  bare["messages"][1].erase("tools");
  test::spit(dir + "/bare.json", bare.dump());
  r = test::run_deltafin(
      {"render", "--model", test::data_dir() + "/tokenizer", "--request", dir + "/bare.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("messages[1].content: missing (a system message needs content)"),
            std::string::npos)
      << r.err;
  json empty_tools = bare;
  empty_tools["messages"][1]["tools"] = json::array();
  EXPECT_THROW(
      server::parse_chat_request(empty_tools, test::k3_limits(4096, 4096), test::k3_tokenizer()),
      std::exception);
}

// ------------------------------------------------------------------------------------------
// B5: every command that reads a model falls back to $DELTAFIN_MODEL, then the demo, as run,
// chat and serve do; bench --help says what its default drafter is.

TEST(RoughEdges, EveryModelCommandFallsBackToTheDemo) {
  use_private_cache("edges-b5-cache");
  auto r = test::run_deltafin({"tokenize", "--text", "The king said"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[472,706,498]\n");  // the demo's own ids (tests/data/k3-demo)
  EXPECT_NE(r.err.find("using the built-in demo"), std::string::npos) << r.err;
  r = test::run_deltafin({"inspect"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("demo-k3-english"), std::string::npos) << r.out;
  // B4: docs/PYTHON.md says how the package reaches the demo: this command, this folder.
  EXPECT_TRUE(
      fs::exists(std::string(std::getenv("DELTAFIN_CACHE")) + "/demo-k3-english/config.json"));
  const std::string python_md = test::slurp(source_root() + "/docs/PYTHON.md");
  EXPECT_NE(python_md.find("build/src/cli/deltafin inspect"), std::string::npos);
  EXPECT_NE(python_md.find("`$DELTAFIN_CACHE/demo-k3-english`"), std::string::npos);
  const std::string dir = test::temp_dir("edges-b5");
  test::spit(dir + "/text.txt", "The king said unto the people, and the LORD spake.\n");
  r = test::run_deltafin({"perplexity", "--file", dir + "/text.txt", "--json", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(json::parse(r.out)["perplexity"].get<double>(), 1.0) << r.out;
  r = test::run_deltafin({"bench", "--prompt-tokens", "4", "--gen-tokens", "4", "--reps", "1",
                          "--no-disk-probe", "--json", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The demo's own drafter is bench's default there, as --help says.
  EXPECT_NE(json::parse(r.out)["draft"].get<std::string>().find("demo-k3-english/draft"),
            std::string::npos)
      << r.out;
  r = test::run_deltafin({"render", "--request", "-"},
                         R"({"messages": [{"role": "user", "content": "Hi"}]})");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = test::run_deltafin({"logits", "--tokens", "472,706", "--out", dir + "/l.f32"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fs::file_size(dir + "/l.f32"), 2u * 1280 * 4);
  // $DELTAFIN_MODEL comes before the demo.
  ::setenv("DELTAFIN_MODEL", tiny_model().c_str(), 1);
  r = test::run_deltafin({"inspect"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(tiny_model()), std::string::npos) << r.out;
  ::unsetenv("DELTAFIN_MODEL");
  r = test::run_deltafin({"bench", "--help"});
  EXPECT_NE(r.out.find("Default: the model folder's draft/ subfolder when it has one"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("default: $DELTAFIN_MODEL, else the built-in demo"), std::string::npos)
      << r.out;
}

// ------------------------------------------------------------------------------------------
// B6: `make demo` builds only the program before it runs it (not the tests, fuzzers and
// benchmarks of the whole tree); B10: the README's test section says `make test` installs
// chromium through apt, and the Makefile prints a line when it does.

TEST(RoughEdges, MakeDemoBuildsOnlyTheProgram) {
  const std::string out = test::temp_dir("edges-make") + "/dry.txt";
  const std::string cmd = fmt::format(
      "make -s -n -C '{}' demo BUILD=/nonexistent-build JOBS=1 > '{}' 2>&1", source_root(), out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::slurp(out);
  const std::string dry = test::slurp(out);
  EXPECT_NE(dry.find("cmake --build /nonexistent-build -j 1 --target deltafin"), std::string::npos)
      << dry;
  // No other build of the tree before the demo runs.
  const size_t run = dry.find("/nonexistent-build/src/cli/deltafin run");
  ASSERT_NE(run, std::string::npos) << dry;
  EXPECT_EQ(dry.find("cmake --build /nonexistent-build -j 1\n"), std::string::npos) << dry;

  const std::string readme = test::slurp(source_root() + "/README.md");
  EXPECT_NE(readme.find("Debian's `chromium` for the browser test of the page, printing a line"),
            std::string::npos);
  EXPECT_NE(readme.find("apt may\nupgrade packages chromium depends on"), std::string::npos);
  const std::string makefile = test::slurp(source_root() + "/Makefile");
  EXPECT_NE(makefile.find("echo \"installing Debian's chromium for the browser test"),
            std::string::npos);
}

// ------------------------------------------------------------------------------------------
// B7: run --chat marks the thinking channel in plain text, so piped output (no colour) still
// shows where thinking ends and the answer starts; --hide-thinking leaves both out.

TEST(RoughEdges, PipedChatMarksTheThinkingChannel) {
  use_private_cache("edges-b7-cache");
  const std::vector<std::string> base = {"run",     "--chat", "--prompt",  "Tell me a fortune.",
                                         "--draft", "none",   "--threads", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_deltafin(args, "", 120);
  };
  // Cut off inside the thinking channel: the mark still closes it.
  auto r = with({"--max-new", "4", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("[thinking]\n", 0), 0u) << r.out;
  EXPECT_TRUE(r.out.ends_with("\n[/thinking]\n")) << r.out;
  // Thinking, then the answer after the closing mark.
  r = with({"--max-new", "300", "--temperature", "0.7", "--top-p", "0.95", "--seed", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t end = r.out.find("\n[/thinking]\n");
  ASSERT_NE(end, std::string::npos) << r.out;
  EXPECT_EQ(r.out.rfind("[thinking]\n", 0), 0u) << r.out;
  const std::string answer = r.out.substr(end + 13);
  EXPECT_NE(answer.find_first_not_of(" \n"), std::string::npos) << r.out;
  EXPECT_EQ(answer.find("[thinking]"), std::string::npos) << r.out;
  r = with({"--max-new", "300", "--temperature", "0.7", "--top-p", "0.95", "--seed", "1",
            "--hide-thinking"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("thinking]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out, answer) << "the same answer without the thinking";
}

// ------------------------------------------------------------------------------------------
// B8: --stats names the router's prediction recall apart from the prefetch counts (it is
// measured when nothing needed prefetching), and a trunk held whole is described as such.

TEST(RoughEdges, StatsWordingSaysWhatWasMeasured) {
  use_private_cache("edges-b8-cache");
  auto r = test::run_deltafin({"run", "--prompt", "The king said", "--max-new", "8", "--stats",
                               "--threads", "1", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("; expert prediction recall "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("used, recall"), std::string::npos) << r.err;
  r = test::run_deltafin({"bench", "--prompt-tokens", "4", "--gen-tokens", "4", "--reps", "1",
                          "--no-disk-probe", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("all 6 trunk units resident, none streamed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("6 of 6 trunk units"), std::string::npos) << r.out;
}

// ------------------------------------------------------------------------------------------
// B2: generation_config.json gives the default sampling (as vLLM reads it) to run, chat, serve
// and the C API; a flag or request field always wins; a bad value is refused naming the field.
// The demo ships one, so its chat turns end by themselves instead of looping to the limit.

// A copy of the tiny model, to add files to.
std::string copy_of_tiny(const std::string& name) {
  const std::string d = test::temp_dir(name) + "/model";
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(tiny_model()))
    fs::copy_file(e.path(), d + "/" + e.path().filename().string());
  return d;
}

json run_json(const std::string& model, std::vector<std::string> extra) {
  std::vector<std::string> a = {"run",  "--model", model, "--prompt-ids", "1,2,3", "--max-new",
                                "24",   "--seed",  "7",   "--threads",    "1",     "--draft",
                                "none", "--json"};
  a.insert(a.end(), extra.begin(), extra.end());
  const auto r = test::run_deltafin(a);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

TEST(RoughEdges, GenerationConfigGivesTheDefaultSampling) {
  const std::string m = copy_of_tiny("edges-b2");
  test::spit(m + "/generation_config.json",
             R"({"do_sample": true, "temperature": 0.9, "top_k": 5, "max_new_tokens": 3})");
  const json greedy = run_json(tiny_model(), {})["completion_ids"];
  const json sampled = run_json(tiny_model(), {"--temperature", "0.9", "--top-k", "5"});
  ASSERT_NE(sampled["completion_ids"], greedy) << "the settings must change this output";
  EXPECT_EQ(run_json(m, {})["completion_ids"], sampled["completion_ids"]);
  EXPECT_EQ(run_json(m, {"--temperature", "0"})["completion_ids"], greedy);  // a flag wins
  EXPECT_EQ(run_json(m, {"--top-k", "0"})["completion_ids"],
            run_json(tiny_model(), {"--temperature", "0.9"})["completion_ids"]);

  // The server: a request that leaves the sampling fields out gets the file's.
  {
    test::ServerProcess srv({"--threads", "1", "--draft", "none"}, m);
    ASSERT_TRUE(srv.ready()) << srv.err();
    auto c = srv.client();
    auto text = [&](json extra) {
      json body = {{"prompt", json::array({1, 2, 3})}, {"max_tokens", 24}, {"seed", 7}};
      body.update(extra);
      const auto r = test::post_json(*c, "/v1/completions", body);
      EXPECT_EQ(r.status, 200) << r.body;
      return r.j["choices"][0]["text"];
    };
    const json defaults = text(json::object());
    EXPECT_EQ(defaults, text({{"temperature", 0.9}, {"top_k", 5}}));
    EXPECT_NE(defaults, text({{"temperature", 1.0}, {"top_k", 0}}))
        << "OpenAI's defaults are not the file's";
  }

  // A value out of range is refused, naming the file and the field.
  test::spit(m + "/generation_config.json", R"({"temperature": -1, "top_p": 0})");
  auto r = test::run_deltafin({"run", "--model", m, "--prompt-ids", "1", "--max-new", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(m + "/generation_config.json: temperature: expected a number from 0 to 2, "
                           "found -1; top_p: expected a number > 0 and <= 1, found 0"),
            std::string::npos)
      << r.err;
}

// The demo's chat turns end by themselves (its generation_config.json samples; greedy loops).
TEST(RoughEdges, DemoChatTurnsEndByThemselves) {
  use_private_cache("edges-b2-demo");
  for (const char* seed : {"1", "2", "3"}) {
    auto r = test::run_deltafin({"run", "--chat", "--prompt", "Tell me a fortune.", "--max-new",
                                 "400", "--seed", seed, "--stats", "--threads", "1"},
                                "", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("stop: end_of_turn"), std::string::npos) << seed << ": " << r.err;
  }
  // B8: the note on the demo's drafter shows only when it drafts with it.
  auto r = test::run_deltafin({"run", "--prompt", "The king", "--max-new", "2"});
  EXPECT_NE(r.err.find("note: the demo drafts with its own EAGLE-3.1 drafter"), std::string::npos)
      << r.err;
  for (const char* draft : {"none", "ngram"}) {
    r = test::run_deltafin({"run", "--prompt", "The king", "--max-new", "2", "--draft", draft});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("drafter"), std::string::npos) << draft << ": " << r.err;
  }
}

// ------------------------------------------------------------------------------------------
// B3: special tokens and cut-off structure never become text. An id the checkpoint's
// generation_config.json names as end of sequence ends generation (the demo's [EOS]); a tag cut
// off by the token limit is not content; raw output leaves K3 tags and specials out.

TEST(RoughEdges, GenerationConfigEndOfSequenceEndsGeneration) {
  const json greedy = run_json(tiny_model(), {"--temperature", "0"});
  ASSERT_GE(greedy["completion_ids"].size(), 4u);
  const int third = greedy["completion_ids"][2].get<int>();
  const std::string m = copy_of_tiny("edges-b3");
  test::spit(m + "/generation_config.json",
             fmt::format(R"({{"eos_token_id": [{}], "temperature": 0}})", third));
  const json out = run_json(m, {});
  EXPECT_EQ(out["stop_reason"], "stop_token") << out.dump();
  EXPECT_LE(out["completion_ids"].size(), 3u) << out.dump();
  // The demo's own file names its [EOS] (1025) as well as the configured 1026.
  use_private_cache("edges-b3-demo");
  const auto r = test::run_deltafin({"inspect"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string demo = std::string(std::getenv("DELTAFIN_CACHE")) + "/demo-k3-english";
  const Tokenizer tok = Tokenizer::load(demo);
  const auto ids = stop_ids_for(load_config(demo), &tok, load_generation_config(demo));
  EXPECT_NE(std::find(ids.begin(), ids.end(), *tok.special_id("[EOS]")), ids.end());
}

// Drives a request's Generation with logits that force `output`; the response it builds.
json forced(const json& body, bool chat, const std::string& output) {
  const auto limits = test::k3_limits(4096, 4096);
  server::ServeRequest req =
      chat ? server::parse_chat_request(body, limits, test::k3_tokenizer())
           : server::parse_completion_request(body, limits, test::k3_tokenizer());
  Generation g(req.prompt, req.params, &test::k3_tokenizer(), test::k3_tokenizer().vocab_size());
  server::ResponseBuilder b(test::k3_tokenizer(),
                            chat ? server::Endpoint::chat : server::Endpoint::completions, "id", 1,
                            "kimi-k3", false, true);
  b.begin();
  test::force_output(g, output, [&](const server::StepUpdate& u) { b.add(u); });
  server::Usage usage{static_cast<int64_t>(req.prompt.size()), 0,
                      static_cast<int64_t>(g.tokens().size())};
  b.end(g.stop_reason(), usage);
  return b.response(g.stop_reason(), usage);
}

TEST(RoughEdges, CutOffTagsAndSpecialsAreNeverContent) {
  const std::string thinking = "Hmm.<|close|>think<|sep|><|open|>response";
  const std::string answer = thinking + "<|sep|>Hello there<|close|>response<|sep|><|end_of_msg|>";
  // Cut off after "<|open|>response": no content, not "<|open|>response".
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
               {"max_tokens", test::k3_tokenizer().encode_with_special(thinking).size()}};
  json r = forced(body, true, answer);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  const json& content = r["choices"][0]["message"]["content"];
  EXPECT_TRUE(content.is_null() || content == "") << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Hmm.") << r.dump();
  // Whole, the tag is structure and the text is content.
  body["max_tokens"] = 64;
  r = forced(body, true, answer);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello there") << r.dump();
  // Raw completions: tags, [EOS] and other specials are left out, cut-off tags too.
  const std::string out = " one<|close|>response<|sep|> two[EOS] three<|open|>resp";
  const json raw = {{"prompt", "Say"},
                    {"max_tokens", test::k3_tokenizer().encode_with_special(out).size()},
                    {"temperature", 0}};
  r = forced(raw, false, out);
  EXPECT_EQ(r["choices"][0]["text"], " one two three") << r.dump();
}

// ------------------------------------------------------------------------------------------
// B9: the bench HTML report carries the drafting figures its text output shows.

TEST(RoughEdges, BenchReportShowsDrafting) {
  use_private_cache("edges-b9-cache");
  const std::string file = test::temp_dir("edges-b9") + "/report.html";
  auto r = test::run_deltafin({"bench", "--prompt-tokens", "8", "--gen-tokens", "16", "--reps", "1",
                               "--no-disk-probe", "--threads", "1", "--report", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("drafting   ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at + 11, r.out.find('\n', at) - at - 11);
  EXPECT_NE(line.find("tokens per target pass"), std::string::npos) << line;
  EXPECT_NE(test::slurp(file).find("<td>drafting</td><td>" + line + "</td>"), std::string::npos)
      << line;
}

// ------------------------------------------------------------------------------------------
// C7: --gpu-memory with the GPU off, or above what the device has, is refused (it passed
// silently); every server response says nosniff, JSON errors that echo a path included.

TEST(RoughEdges, GpuMemoryIsCheckedAgainstTheGpu) {
  auto r = test::run_deltafin({"run", "--model", tiny_model(), "--prompt-ids", "1", "--max-new",
                               "1", "--gpu-memory", "1G"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gpu-memory 1G: needs a GPU, and the gpu setting is off"),
            std::string::npos)
      << r.err;
  r = test::run_deltafin({"run", "--model", tiny_model(), "--prompt-ids", "1", "--max-new", "1",
                          "--gpu", "0", "--gpu-memory", "100T"},
                         "", 120);
  if (r.err.find("no Vulkan") != std::string::npos)
    GTEST_SKIP() << "no Vulkan device for the second half: " << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gpu-memory 104857600 MiB: more than the device has"), std::string::npos)
      << r.err;
}

TEST(RoughEdges, EveryServerResponseSaysNosniff) {
  test::ServerProcess srv({"--threads", "1"}, tiny_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const auto missing = test::get(*c, "/v1/%3Cscript%3Enope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("<script>"), std::string::npos) << "the test needs an echoed path";
  const auto bad = test::post_json(*c, "/v1/completions", json{{"prompt", 5}});
  EXPECT_EQ(bad.status, 400);
  const auto ok = test::get(*c, "/v1/models");
  EXPECT_EQ(ok.status, 200);
  for (const auto* res : {&missing, &bad, &ok}) {
    const auto it = res->headers.find("X-Content-Type-Options");
    ASSERT_NE(it, res->headers.end()) << res->body;
    EXPECT_EQ(it->second, "nosniff");
    EXPECT_EQ(res->headers.count("X-Content-Type-Options"), 1u);
  }
}

// ------------------------------------------------------------------------------------------
// C3: a command that writes a user-named file refuses a target that exists and is not a
// regular file (a symbolic link, a FIFO, a folder; as root a device node too) instead of
// renaming over it; a regular file is replaced. Errors name the path typed.

struct Targets {
  std::string dir, link, fifo, folder, linked;
};
Targets make_targets(const std::string& name) {
  Targets t;
  t.dir = test::temp_dir(name);
  t.linked = t.dir + "/precious.txt";
  test::spit(t.linked, "precious\n");
  t.link = t.dir + "/link.html";
  fs::create_symlink(t.linked, t.link);
  t.fifo = t.dir + "/fifo";
  EXPECT_EQ(::mkfifo(t.fifo.c_str(), 0600), 0);
  t.folder = t.dir + "/folder";
  fs::create_directories(t.folder);
  return t;
}
void expect_untouched(const Targets& t) {
  EXPECT_TRUE(fs::is_symlink(t.link));
  EXPECT_EQ(test::slurp(t.linked), "precious\n");
  EXPECT_TRUE(fs::is_fifo(t.fifo));
  EXPECT_TRUE(fs::is_directory(t.folder));
}

TEST(RoughEdges, UserNamedOutputsNeverReplaceWhatIsNotARegularFile) {
  const Targets t = make_targets("edges-c3");
  const std::string m = tiny_model();
  struct Case {
    std::string target, kind;
  };
  const std::vector<Case> cases = {
      {t.link, "a symbolic link"}, {t.fifo, "a FIFO"}, {t.folder, "a folder"}};
  for (const auto& c : cases) {
    auto r = test::run_deltafin({"bench", "--model", m, "--prompt-tokens", "2", "--gen-tokens", "2",
                                 "--reps", "1", "--no-disk-probe", "--report", c.target},
                                "", 60);
    EXPECT_EQ(r.exit_code, 1) << c.target << ": " << r.err;
    EXPECT_NE(r.err.find(c.target + " exists and is " + c.kind + ": refusing to replace it"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "") << "refused before the benchmark ran";
    r = test::run_deltafin({"logits", "--model", m, "--tokens", "1,2", "--out", c.target}, "", 60);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(c.target + " exists and is " + c.kind), std::string::npos) << r.err;
    // chat /save: the error names the path typed, and the session goes on.
    r = test::run_deltafin({"chat", "--model", m, "--max-new", "2"},
                           "Hi\n/save " + c.target + "\n/stats\n", 60);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("error: " + c.target + " exists and is " + c.kind), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find(".tmp"), std::string::npos) << r.err;  // the temporary is never named
  }
  expect_untouched(t);
  // make-model: a symbolic link to an empty folder is not replaced by the new folder.
  const std::string empty = t.dir + "/empty";
  fs::create_directories(empty);
  fs::create_symlink(empty, t.dir + "/model-link");
  auto r = test::run_deltafin({"make-model", t.dir + "/model-link", "--preset", "tiny", "--quiet"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("model-link is a symbolic link: refusing to replace it"), std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_symlink(t.dir + "/model-link"));
  // A /save into a folder that does not exist names the file typed, not its temporary.
  r = test::run_deltafin({"chat", "--model", m, "--max-new", "2"},
                         "Hi\n/save " + t.dir + "/no/such/x.json\n", 60);
  EXPECT_NE(r.err.find("error: cannot write " + t.dir + "/no/such/x.json: No such file"),
            std::string::npos)
      << r.err;
  // The heat file (--cache-policy pinned persists expert heat in the cache folder).
  use_private_cache("edges-c3-cache");
  const std::string heat = heat_file_for(m);
  ASSERT_FALSE(heat.empty());
  fs::create_directories(fs::path(heat).parent_path());
  fs::create_symlink(t.linked, heat);
  r = test::run_deltafin({"run", "--model", m, "--prompt-ids", "1,2", "--max-new", "2",
                          "--cache-policy", "pinned", "--memory-budget", "1G"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("could not save expert heat statistics: " + heat +
                       " exists and is a "
                       "symbolic link"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_symlink(heat));
  EXPECT_EQ(test::slurp(t.linked), "precious\n");
  // And a regular file is replaced as before.
  test::spit(t.dir + "/old.f32", "old");
  r = test::run_deltafin({"logits", "--model", m, "--tokens", "1", "--out", t.dir + "/old.f32"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(fs::file_size(t.dir + "/old.f32"), 3u);
}

// What make-model writes is private whatever the umask (folder 0700, files 0600), like every
// other file Deltafin creates; its shards were 0644 and its folder followed the umask.
TEST(RoughEdges, MakeModelWritesAPrivateFolder) {
  const std::string out = test::temp_dir("edges-private") + "/model";
  const mode_t old = ::umask(022);
  const auto r = test::run_deltafin({"make-model", out, "--preset", "tiny", "--quiet"});
  ::umask(old);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << e.path();
    ++files;
  }
  EXPECT_GE(files, 4) << "config, index or single shard, tokenizer files";
}

// ------------------------------------------------------------------------------------------
// C6: a config.json that is a FIFO (or a folder) is refused at once, naming what it is, by
// propose and run (draft folder) and for the model itself; nothing waits on it.

TEST(RoughEdges, ConfigFilesMustBeRegularFiles) {
  const std::string dir = test::temp_dir("edges-c6");
  const std::string draft = dir + "/draft";
  fs::create_directories(draft);
  fs::copy_file(test::data_dir() + "/eagle3-tiny/model/model.safetensors",
                draft + "/model.safetensors");
  ASSERT_EQ(::mkfifo((draft + "/config.json").c_str(), 0600), 0);
  const std::string target = test::data_dir() + "/k3-tiny-mxfp4/model";
  const std::string want = draft + "/config.json is a FIFO (expected a regular file)";
  auto r = test::run_deltafin(
      {"propose", "--model", target, "--draft", draft, "--tokens", "1,2", "--anchor", "3"}, "", 30);
  EXPECT_NE(r.err.find(want), std::string::npos) << r.exit_code << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = test::run_deltafin(
      {"run", "--model", target, "--prompt-ids", "1,2", "--max-new", "1", "--draft", draft}, "",
      30);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("no config.json"), std::string::npos) << r.err;
  // The target's own config.json.
  const std::string model = dir + "/model";
  fs::create_directories(model);
  ASSERT_EQ(::mkfifo((model + "/config.json").c_str(), 0600), 0);
  r = test::run_deltafin({"inspect", "--model", model}, "", 30);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(model + "/config.json is a FIFO (expected a regular file)"),
            std::string::npos)
      << r.err;
}

// ------------------------------------------------------------------------------------------
// C4, C5, C7: a draft's config.json is read at full width and range-checked, and nonsense that
// used to load (and then draft NaN) is refused naming the field, once.

std::string eagle_config() {
  return test::slurp(test::data_dir() + "/eagle3-tiny/model/config.json");
}
std::string dspark_config() {
  return test::slurp(test::data_dir() + "/dspark-tiny/model/config.json");
}
// The error parse_draft_config gives for `text` edited by `edit` (empty when it loads).
template <class Edit>
std::string draft_error(const std::string& text, Edit edit) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  try {
    parse_draft_config(j.dump(), "the draft config");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RoughEdges, DraftConfigNumbersAreReadAtFullWidthAndNonsenseIsRefused) {
  using J = nlohmann::json;
  auto eagle = [](J v) {
    return draft_error(eagle_config(),
                       [&](J& c) { c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = v; });
  };
  // C4: 2^32 + 1 is not layer 1, 2^40 is not layer 0, 2^31 is not layer -2^31.
  EXPECT_NE(eagle(J::parse("[1, 4294967297]"))
                .find("eagle_config.eagle_aux_hidden_state_layer_ids: layer 4294967297 is out of "
                      "range (expected 0-based target layers, 0 to 4095)"),
            std::string::npos)
      << eagle(J::parse("[1, 4294967297]"));
  EXPECT_NE(eagle(J::parse("[1099511627776]")).find("layer 1099511627776 is out of range"),
            std::string::npos);
  EXPECT_NE(eagle(J::parse("[2147483648]")).find("layer 2147483648 is out of range"),
            std::string::npos);
  EXPECT_NE(eagle(J::parse("[18446744073709551615]")).find("layer 18446744073709551615 is out"),
            std::string::npos);
  EXPECT_NE(eagle(J::parse("[-1]")).find("layer -1 is out of range"), std::string::npos);
  EXPECT_EQ(eagle(J::parse("[1, 4, 7]")), "");
  auto dspark = [](const char* key, J v) {
    return draft_error(dspark_config(), [&](J& c) { c[key] = v; });
  };
  EXPECT_NE(dspark("target_layer_ids", J::parse("[1, 4294967300]"))
                .find("target_layer_ids: layer 4294967300 is out of range"),
            std::string::npos);
  // C5: each nonsense value is named.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {eagle_config(), R"({"rms_norm_eps": -1})"},
      {eagle_config(), R"({"rms_norm_eps": 0})"},
      {eagle_config(), R"({"rope_theta": 0})"},
      {dspark_config(), R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
         "original_max_position_embeddings": 64, "rope_theta": -5}})"},
      {dspark_config(), R"({"num_target_layers": 2})"},
      {eagle_config(), R"({"architectures": ["Foo"]})"},
      {eagle_config(), R"({"architectures": []})"},
      {dspark_config(), R"({"architectures": 5})"},
  };
  const std::vector<std::string> expect = {
      "rms_norm_eps: expected a number > 0, found -1",
      "rms_norm_eps: expected a number > 0, found 0",
      "rope_theta: expected a number > 0, found 0",
      "rope_parameters.rope_theta: expected a number > 0, found -5",
      "num_target_layers: 2 disagrees with target_layer_ids, which lists 3",
      "unknown drafter kind (architectures \"Foo\", model_type \"kimi_k2\"); expected an EAGLE-3 "
      "draft (architectures [\"Eagle3DeepseekV2ForCausalLM\"], with eagle_config) or a DSpark "
      "draft ([\"K3DSparkModel\"])",
      "unknown drafter kind (architectures [], model_type \"kimi_k2\")",
      "unknown drafter kind (architectures 5, model_type \"k3_dspark\")",
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const J patch = J::parse(cases[i].second);
    const std::string e = draft_error(cases[i].first, [&](J& c) { c.merge_patch(patch); });
    EXPECT_NE(e.find(expect[i]), std::string::npos) << cases[i].second << " -> " << e;
  }
  // target_num_hidden_layers must be the target's (9 layers here), through the binary.
  const std::string dir = test::temp_dir("edges-c5") + "/draft";
  fs::create_directories(dir);
  J d = J::parse(dspark_config());
  d["target_num_hidden_layers"] = 12;
  test::spit(dir + "/config.json", d.dump());
  fs::copy_file(test::data_dir() + "/dspark-tiny/model/model.safetensors",
                dir + "/model.safetensors");
  auto r = test::run_deltafin({"propose", "--model", test::data_dir() + "/k3-tiny-mxfp4/model",
                               "--draft", dir, "--tokens", "1,2", "--anchor", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("target_num_hidden_layers 12 does not match the target's 9 layers"),
            std::string::npos)
      << r.err;
  // C7: draft_vocab_size 0 is one problem, said once.
  const std::string e = draft_error(eagle_config(), [](J& c) { c["draft_vocab_size"] = 0; });
  size_t n = 0;
  for (size_t at = e.find("draft_vocab_size"); at != std::string::npos;
       at = e.find("draft_vocab_size", at + 1))
    ++n;
  EXPECT_EQ(n, 1u) << e;
}

}  // namespace
}  // namespace deltafin
