// Constrained decoding's per-token cost: the time to compute a grammar's token mask on a
// 100,256-token vocabulary (the test tokenizer, or DELTAFIN_TOKENIZER_DIR, e.g. a K3 model
// folder with its 163,840 tokens), and the time to compile a schema or grammar.
//
// Each mask benchmark replays documents that satisfy its grammar (encoded by the real
// tokenizer) through a Matcher and times every fill_mask() call: median, p99 and max per token
// are reported as counters (`med_us`, `p99_us`, `max_us`). "warm" means the grammar's per-node
// masks are already computed (the normal case after its first request, as compiled grammars are
// cached); "cold" compiles a fresh grammar per document, so node masks are computed while
// generating.
//
//   build/bench/deltafin_kernel_bench --benchmark_filter=Grammar
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace deltafin;
using namespace deltafin::grammar;

std::string tokenizer_dir() {
  if (const char* env = std::getenv("DELTAFIN_TOKENIZER_DIR")) return env;
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "tests" / "data" /
          "tokenizer")
      .string();
}

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(tokenizer_dir());
  return t;
}

struct Workload {
  const char* name;
  std::string schema;  // JSON Schema text
  std::vector<std::string> docs;
};

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> w = {
      {"person",
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":60},
          "age":{"type":"integer","minimum":0,"maximum":150},
          "email":{"type":"string","format":"email"},
          "tags":{"type":"array","items":{"type":"string"},"maxItems":8}},
          "required":["name","age"],"additionalProperties":false})",
       {R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry", "engines"]})",
        R"({"name": "Grace Hopper, rear admiral", "age": 85, "tags": []})"}},
      {"tool_args",
       R"({"type":"object","properties":{"path":{"type":"string"},
          "line":{"type":"integer"},"replace":{"type":"boolean"},
          "text":{"type":"string"}},"required":["path","text"]})",
       {R"({"path": "src/generate/generation.cpp", "line": 120, "replace": true, "text": "  // Stop strings apply to the content channel only.\n  if (stop) return;\n"})"}},
      {"nested",
       R"({"$defs":{"node":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},
          "kind":{"enum":["leaf","branch"]},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
          "required":["id","kind"]}},"$ref":"#/$defs/node"})",
       {R"({"id": "0f8fad5b-d9cb-469f-a165-70867728950e", "kind": "branch", "children": [{"id": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "kind": "leaf"}, {"id": "16fd2706-8baf-433b-82eb-8c7fada847da", "kind": "leaf", "children": []}]})"}},
      // Decimal bounds (exact, digit by digit) on both signs.
      {"measurement",
       R"({"type":"object","properties":{"value":{"type":"number","minimum":-2.5,"maximum":3.75},
          "ratio":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":0.5},
          "when":{"type":"string","format":"date-time"}},"required":["value","ratio","when"]})",
       {R"({"value": -1.125, "ratio": 0.25, "when": "2026-12-06T09:30:00Z"})",
        R"({"value": 3.75, "ratio": 0.0001, "when": "2024-02-29T23:59:59.5+01:00"})"}},
  };
  return w;
}

std::shared_ptr<const CompiledGrammar> compile_fresh(const std::string& schema) {
  return compile_json_schema(nlohmann::ordered_json::parse(schema), TokenVocab::of(tokenizer()),
                             /*use_cache=*/false);
}

void run_masks(benchmark::State& state, const Workload& w, bool cold) {
  const Tokenizer& tok = tokenizer();
  std::vector<std::vector<int32_t>> docs;
  for (const auto& d : w.docs) docs.push_back(tok.encode_ordinary(d));
  auto grammar = compile_fresh(w.schema);
  if (!cold) grammar->precompute();
  std::vector<double> us;
  TokenMask mask;
  for (auto _ : state) {
    for (const auto& ids : docs) {
      if (cold) {
        state.PauseTiming();
        grammar = compile_fresh(w.schema);
        state.ResumeTiming();
      }
      Matcher m(grammar, {tok.vocab_size() - 1});
      for (const int32_t t : ids) {
        const auto t0 = std::chrono::steady_clock::now();
        m.fill_mask(mask);
        const auto t1 = std::chrono::steady_clock::now();
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        if (!mask.test(t) || !m.accept(t)) {
          state.SkipWithError("a document token was refused");
          return;
        }
      }
    }
  }
  std::sort(us.begin(), us.end());
  state.counters["med_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  state.counters["max_us"] = us.back();
  state.counters["vocab"] = tok.vocab_size();
  state.counters["tokens"] = static_cast<double>(us.size());
}

void BM_GrammarMaskWarm(benchmark::State& state) {
  run_masks(state, workloads()[static_cast<size_t>(state.range(0))], false);
  state.SetLabel(workloads()[static_cast<size_t>(state.range(0))].name);
}
BENCHMARK(BM_GrammarMaskWarm)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

void BM_GrammarMaskCold(benchmark::State& state) {
  run_masks(state, workloads()[static_cast<size_t>(state.range(0))], true);
  state.SetLabel(workloads()[static_cast<size_t>(state.range(0))].name);
}
BENCHMARK(BM_GrammarMaskCold)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_GrammarCompile(benchmark::State& state) {
  const Workload& w = workloads()[static_cast<size_t>(state.range(0))];
  TokenVocab::of(tokenizer());
  for (auto _ : state) benchmark::DoNotOptimize(compile_fresh(w.schema));
  state.SetLabel(w.name);
}
BENCHMARK(BM_GrammarCompile)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

void BM_GrammarPrecompute(benchmark::State& state) {
  const Workload& w = workloads()[static_cast<size_t>(state.range(0))];
  TokenVocab::of(tokenizer());
  for (auto _ : state) {
    auto g = compile_fresh(w.schema);
    g->precompute();
    state.counters["nodes"] = static_cast<double>(g->nodes_computed());
  }
  state.SetLabel(w.name);
}
BENCHMARK(BM_GrammarPrecompute)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

}  // namespace
