// Tokenizer throughput: encoding 1 MB of mixed text (English, code, CJK, emoji, digits,
// whitespace runs) must take under 1 s on one core (issue 3). Uses the stand-in rank file in
// tests/data/tokenizer (a 100k-rank public BPE), or the folder named by DELTAFIN_TOKENIZER_DIR
// (for example a real K3 model folder).
//
//   build/bench/deltafin_kernel_bench --benchmark_filter=Tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string tokenizer_dir() {
  if (const char* env = std::getenv("DELTAFIN_TOKENIZER_DIR")) return env;
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "tests" / "data" /
          "tokenizer")
      .string();
}

const deltafin::Tokenizer& tokenizer() {
  static const deltafin::Tokenizer t = deltafin::Tokenizer::load(tokenizer_dir());
  return t;
}

// About 1 MB (1,048,576 bytes) of deterministic mixed text.
const std::string& mixed_text() {
  static const std::string text = [] {
    const std::vector<std::string> parts = {
        "The quick brown fox jumps over the lazy dog. ",
        "It's what they'd said: DON'T PANIC, and we've HTTPServer's logs ready.\n",
        "def quicksort(a):\n    if len(a) <= 1:\n        return a\n    p = a[0]\n",
        "for (int i = 0; i < n; ++i) { sum += v[i] * w[i]; }\n",
        "深夜调试一个大语言模型，不想把数据发送到云端。",
        "日本語のテキストとカタカナ。",
        "한국어 문장입니다. ",
        "emoji 😀🚀👩‍💻🇫🇷 ",
        "numbers 1234567 3.14159 2026-12-02 ",
        "     \t\t\n\n   ",
        "Привет, мир! ",
        "naïve café résumé Ångström ",
        "{\"role\": \"user\", \"content\": \"Hello\"} ",
    };
    std::mt19937 rng(42);
    std::string s;
    while (s.size() < (1u << 20)) s += parts[rng() % parts.size()];
    s.resize(1u << 20);
    while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80)
      s.pop_back();  // whole chars
    if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xC0) s.pop_back();
    return s;
  }();
  return text;
}

void BM_TokenizerEncodeOrdinary1MB(benchmark::State& state) {
  const auto& t = tokenizer();
  const auto& text = mixed_text();
  std::size_t n = 0;
  for (auto _ : state) {
    auto ids = t.encode_ordinary(text);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_TokenizerEncodeOrdinary1MB)->Unit(benchmark::kMillisecond);

void BM_TokenizerEncodeWithSpecial1MB(benchmark::State& state) {
  const auto& t = tokenizer();
  const auto& text = mixed_text();
  for (auto _ : state) {
    auto ids = t.encode_with_special(text);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_TokenizerEncodeWithSpecial1MB)->Unit(benchmark::kMillisecond);

void BM_TokenizerDecode1MB(benchmark::State& state) {
  const auto& t = tokenizer();
  const auto ids = t.encode_ordinary(mixed_text());
  for (auto _ : state) {
    auto s = t.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed_text().size()));
}
BENCHMARK(BM_TokenizerDecode1MB)->Unit(benchmark::kMillisecond);

// One 25,000-character whitespace run and one 25,000-character Han run: the longest pieces the
// guards allow, which take the heap merge path.
void BM_TokenizerLongRuns(benchmark::State& state) {
  const auto& t = tokenizer();
  std::string text(25000, ' ');
  text += "x";
  for (int i = 0; i < 25000; ++i) text += "中";
  for (auto _ : state) {
    auto ids = t.encode_ordinary(text);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_TokenizerLongRuns)->Unit(benchmark::kMillisecond);

}  // namespace
