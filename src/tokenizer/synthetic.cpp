// Synthetic tokenizer files for tiny test models (K3-tiny has vocab 512 and no tokenizer).
//
// A real byte-level BPE is produced so that the tokenizer, renderer and CLI can run end to end
// on a synthetic checkpoint: ranks 0..255 are the single bytes in byte order, then merges
// learned by plain BPE training on the sample below (most frequent adjacent pair first; ties to
// the smallest pair of ids, so the output is identical on every machine). When the sample has
// no pair left that occurs twice, the remaining ranks are deterministic filler strings of
// printable ASCII. The special tokens sit at the offsets they have in the real K3 release
// (K3 id - 163584), so code that looks them up by name works unchanged.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

namespace {

// Written for this project: some English prose, a little C++, Python, JSON and shell, so the
// learned merges look like a small real vocabulary.
constexpr std::string_view kSample =
    R"SAMPLE(The quick brown fox jumps over the lazy dog. A tokenizer turns text into numbers
that a language model can read, and it turns the numbers back into text when the model
answers. Most of the time the words of a sentence become one token each: the, and, of, to,
in, is, that, for, with, as, on, was, this, are, be, by, it, at, from, have, not, or, an.
Longer words are split into pieces that appear often in the training data, such as
"token", "ization", "process", "ing", "ed" and "tion". Numbers like 2026, 163584 and 3.14159
are cut into groups of at most three digits. Whitespace matters too: four spaces of
indentation, a tab, a newline or two.

When you run a model on one machine, you want every step to be exact and fast. The model
reads the prompt, writes one token at a time, and stops at the end of its message. If the
tokenizer is almost right, every answer is silently a little worse, so we test it against
reference ids and we keep the tests small, clear and quick to run.

// A small C++ example.
#include <cstdint>
#include <string>
#include <vector>

namespace example {

struct Token {
  int32_t id = 0;
  std::string text;
};

std::vector<Token> split_words(const std::string& input) {
  std::vector<Token> out;
  std::string current;
  for (char c : input) {
    if (c == ' ' || c == '\n') {
      if (!current.empty()) out.push_back({static_cast<int32_t>(out.size()), current});
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) out.push_back({static_cast<int32_t>(out.size()), current});
  return out;
}

}  // namespace example

# The same idea in Python.
def split_words(text: str) -> list[str]:
    """Return the words of text, in order."""
    words = []
    for line in text.splitlines():
        for word in line.split():
            if word:
                words.append(word)
    return words


if __name__ == "__main__":
    print(split_words("hello world\nthis is a test"))
    for i in range(10):
        print(f"{i}: {i * i}")

{"model": "k3-tiny", "vocab_size": 512, "layers": 9, "experts": 32, "top_k": 4,
 "messages": [{"role": "user", "content": "Hello, how are you?"},
              {"role": "assistant", "content": "I am fine, thank you. And you?"}]}

$ deltafin tokenize --model ./model --text "Hello, world!"
$ deltafin render --model ./model --request request.json --json
$ cmake -S . -B build -G Ninja && ninja -C build && ctest --output-on-failure

Questions and answers: What is the capital of France? Paris. How many legs does a spider
have? Eight. Why is the sky blue? Because air scatters blue light more than red light.
Please write a function that returns the sum of a list of numbers, then explain it.
)SAMPLE";

struct NamedOffset {
  int32_t offset;
  const char* name;
};

// K3 ids minus 163584 (docs/MODEL.md §5.1).
constexpr NamedOffset kK3Specials[] = {
    {0, "[BOS]"},
    {1, "[EOS]"},
    {2, "<|end_of_msg|>"},
    {3, "<|open|>"},
    {4, "<|close|>"},
    {5, "<|sep|>"},
    {6, "[start_header_id]"},
    {7, "[end_header_id]"},
    {9, "[EOT]"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {65, "<osagent_mode>"},
    {254, "[UNK]"},
    {255, "[PAD]"},
};

std::vector<std::string> train_ranks(std::size_t n_ranks) {
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> index;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    index.emplace(tokens.back(), b);
  }
  // Words = pre-tokenizer pieces of the sample with their counts, as symbol sequences.
  std::map<std::string, int64_t> counts;
  for_each_piece(kSample, [&](std::string_view piece) { ++counts[std::string(piece)]; });
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [text, count] : counts) {
    Word w{{}, count};
    for (const char c : text) w.syms.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
  }
  const auto key = [](int32_t a, int32_t b) {
    return (static_cast<int64_t>(a) << 32) | static_cast<uint32_t>(b);
  };
  while (tokens.size() < n_ranks) {
    std::unordered_map<int64_t, int64_t> pairs;
    for (const auto& w : words) {
      for (std::size_t i = 0; i + 1 < w.syms.size(); ++i)
        pairs[key(w.syms[i], w.syms[i + 1])] += w.count;
    }
    int64_t best_key = -1, best_count = 1;
    for (const auto& [k, c] : pairs) {
      if (c > best_count || (c == best_count && best_key >= 0 && k < best_key)) {
        best_key = k;
        best_count = c;
      }
    }
    if (best_key < 0) break;  // no pair occurs twice any more
    const auto a = static_cast<int32_t>(best_key >> 32);
    const auto b = static_cast<int32_t>(best_key & 0xFFFFFFFF);
    const std::string merged = tokens[a] + tokens[b];
    int32_t id;
    if (const auto it = index.find(merged); it != index.end()) {
      id = it->second;  // the same bytes were already made by another pair
    } else {
      id = static_cast<int32_t>(tokens.size());
      tokens.push_back(merged);
      index.emplace(merged, id);
    }
    for (auto& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (std::size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w.syms[i]);
        }
      }
      w.syms = std::move(out);
    }
  }
  // Filler: printable ASCII strings of length 2, 3, ... in lexicographic order.
  for (std::size_t len = 2; tokens.size() < n_ranks; ++len) {
    std::string s(len, '!');
    for (;;) {
      if (!index.count(s)) {
        tokens.push_back(s);
        index.emplace(s, static_cast<int32_t>(tokens.size() - 1));
        if (tokens.size() == n_ranks) break;
      }
      std::size_t k = len;
      while (k > 0 && s[k - 1] == '~') s[--k] = '!';
      if (k == 0) break;
      ++s[k - 1];
    }
  }
  return tokens;
}

void write_atomically(const std::filesystem::path& path, const std::string& data) {
  // Built piecewise: g++ 12 gives a false -Wrestrict on chained std::string operator+.
  std::string name = ".";
  name += path.filename().string();
  name += ".tmp-";
  name += std::to_string(::getpid());
  const std::filesystem::path tmp = path.parent_path() / name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}", tmp.string());
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) fail("cannot write {}: I/O error", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail("cannot move {} into place as {}", tmp.string(), path.string());
  }
}

}  // namespace

void write_synthetic_tokenizer(const std::string& dir, int32_t vocab_size) {
  if (vocab_size < 2 * Tokenizer::kNumSpecial || vocab_size > (1 << 20)) {
    fail_arg(
        "synthetic tokenizer: vocab_size {} must be in [512, 1048576] (256 bytes + 256 "
        "special tokens at least)",
        vocab_size);
  }
  const auto n_ranks = static_cast<std::size_t>(vocab_size - Tokenizer::kNumSpecial);
  const std::vector<std::string> tokens = train_ranks(n_ranks);

  std::string model;
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    model += base64::encode(tokens[r]);
    model += ' ';
    model += std::to_string(r);
    model += '\n';
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::object();
  for (const auto& s : kK3Specials) {
    added[std::to_string(n_ranks + static_cast<std::size_t>(s.offset))] = {
        {"content", s.name}, {"lstrip", false},      {"normalized", false},
        {"rstrip", false},   {"single_word", false}, {"special", true}};
  }
  nlohmann::ordered_json cfg = {
      {"added_tokens_decoder", added}, {"bos_token", "[BOS]"},
      {"eos_token", "[EOS]"},          {"pad_token", "[PAD]"},
      {"unk_token", "[UNK]"},          {"tokenizer_class", "TikTokenTokenizer"},
      {"model_max_length", 1048576}};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create folder {}: {}", dir, ec.message());
  write_atomically(std::filesystem::path(dir) / Tokenizer::kRankFile, model);
  write_atomically(std::filesystem::path(dir) / Tokenizer::kConfigFile, cfg.dump(1) + "\n");
}

}  // namespace deltafin
