// Tokenizer tests: the golden ids (library and the real `deltafin tokenize` binary), round
// trips, properties on invented texts that have no reference ids here (other scripts, digit and
// whitespace runs, contractions, emoji sequences, near-miss markers, guard-length runs, invalid
// UTF-8), the PCRE2 rewrite of the pattern, both BPE merge implementations, the incremental
// decoder, loader errors and the synthetic tokenizer generator.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "fixtures/synthetic_tokenizer.h"
#include "test_util.h"
#include "tokenizer/base64.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin {
namespace {

using test::data_dir;
using test::run_deltafin;
using test::slurp;
using test::spit;
using test::temp_dir;

std::string tok_dir() {
  return data_dir() + "/tokenizer";
}

const Tokenizer& golden_tokenizer() {
  static const Tokenizer t = Tokenizer::load(tok_dir());
  return t;
}

nlohmann::json golden_cases() {
  return nlohmann::json::parse(slurp(tok_dir() + "/cases.json"));
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

std::vector<int32_t> operator+(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string base64_of(const std::string& s) {
  return base64::encode(s);
}

[[maybe_unused]] std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string> out;
  for_each_guard_chunk(text, [&](std::string_view chunk) {
    for_each_piece(chunk, [&](std::string_view p) { out.emplace_back(p); });
  });
  return out;
}

template <typename F>
[[maybe_unused]] std::string expect_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected deltafin::Error";
  return "";
}

// ---------------------------------------------------------------------------------------------
// Golden ids.

TEST(TokenizerGolden, LoadsStandIn) {
  const Tokenizer& t = golden_tokenizer();
  EXPECT_EQ(t.n_ranks(), 100256);
  EXPECT_EQ(t.vocab_size(), 100256 + 256);
  const auto cases = golden_cases();
  for (const auto& [name, id] : cases["special_tokens"].items()) {
    EXPECT_EQ(t.special_id(name), id.get<int32_t>()) << name;
  }
  EXPECT_EQ(t.special_id("<|reserved_token_100262|>"), 100262);
  EXPECT_EQ(t.special_id("<|reserved_token_100511|>"), 100511);
  EXPECT_FALSE(t.special_id("<|reserved_token_100512|>"));
  EXPECT_EQ(t.token_bytes(100258), "<|end_of_msg|>");
  EXPECT_TRUE(t.is_special(100256));
  EXPECT_FALSE(t.is_special(100255));
  EXPECT_FALSE(t.is_special(100512));
}

TEST(TokenizerGolden, PatternIsTheReferencePattern) {
  EXPECT_EQ(golden_cases()["pat_str"].get<std::string>(), std::string(kKimiPatStr));
}

TEST(TokenizerGolden, LibraryReproducesEveryCase) {
  const Tokenizer& t = golden_tokenizer();
  const auto cases = golden_cases();
  ASSERT_GE(cases["cases"].size(), 20u);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(t.encode_ordinary(text), ids_of(c["ordinary"])) << "ordinary: " << text;
    EXPECT_EQ(t.encode_with_special(text), ids_of(c["with_special"])) << "with_special: " << text;
    EXPECT_EQ(t.decode(ids_of(c["ordinary"])), text);
    EXPECT_EQ(t.decode(ids_of(c["with_special"])), text);
  }
}

TEST(TokenizerGolden, BinaryReproducesEveryCase) {
  const std::string dir = temp_dir("tok-golden");
  int n = 0;
  const auto cases = golden_cases();
  ASSERT_GE(cases["cases"].size(), 20u);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::string file = dir + "/case" + std::to_string(n++) + ".txt";
    spit(file, text);
    for (const bool special : {false, true}) {
      std::vector<std::string> args = {"tokenize", "--model", tok_dir(), "--file", file};
      if (special) args.push_back("--special");
      const auto r = run_deltafin(args);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      ASSERT_FALSE(r.out.empty());
      EXPECT_EQ(r.out.back(), '\n');
      EXPECT_EQ(ids_of(nlohmann::json::parse(r.out)),
                ids_of(c[special ? "with_special" : "ordinary"]))
          << text;
    }
    // --text takes the same bytes (argv cannot carry an empty string portably; skip that one).
    if (!text.empty()) {
      const auto r = run_deltafin({"tokenize", "--model", tok_dir(), "--text", text});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(ids_of(nlohmann::json::parse(r.out)), ids_of(c["ordinary"])) << text;
    }
    // Decoding through the binary gives back exactly the input bytes.
    const std::string ids_file = file + ".ids";
    spit(ids_file, c["with_special"].dump());
    const auto d = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--file", ids_file});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(d.out, text);
  }
}

// ---------------------------------------------------------------------------------------------
// Invented texts: no reference ids here, so check what must hold regardless.

const std::vector<std::string>& invented_texts() {
  static const std::vector<std::string> texts = {
      "Привет, мир! Как дела?",
      "Γειά σου Κόσμε",
      "שלום עולם",
      "مرحبا بالعالم",
      "नमस्ते दुनिया",
      "สวัสดีชาวโลก",
      "ქართული ენა",
      "Ελληνικά ΚΕΦΑΛΑΙΑ και πεζά",
      "中文，标点。「引号」、顿号；冒号：",
      "カタカナーひらがな々〆",
      "한국어　전각 공백",
      "0 12 345 6789 1234567890 ０１２３ ١٢٣ ½ ²",
      "3.14159e-10 -42 +7 1,000,000",
      "a  b   c    d\t\te\n\n\nf\r\n\r\ng",
      "trailing spaces   ",
      "trailing newline\n",
      "   ",
      "\n\n",
      "\t \n \t",
      " \u00a0\u2003\u3000x",
      "\u0085next line\u2028sep",
      "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T",
      "i'm you're we've they'll he'd it's don't",
      "I'm You'Re wE'vE",
      "'s 's' ''s x'sy",
      "ſ'ſ O'ſ",
      "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 thumbs 🧑🏿‍🚀",
      "⌚️✨☕ 1️⃣ #️⃣",
      "<|open|",
      "<|end_of_msg|",
      "<|OPEN|>",
      "< |open|>",
      "<|open |>",
      "|open|>",
      "<|open|>",
      "[BOS][EOS] [bos] [ BOS ]",
      "<|reserved_token_100300|> <|reserved_token_999999|>",
      "<<|open|>>",
      "<|sep|<|sep|>",
      "e\u0301 combining and \u0300 alone",
      "ZWJ\u200dalone \ufeffBOM",
      "snake_case kebab-case camelCase PascalCase SCREAMING_CASE",
      "x=1;y=2;\nif(x<y){return;}",
      "http://example.com/a?b=c&d=e#f",
      "\x01\x02\x7f control",
      std::string("nul\0byte", 8),
  };
  return texts;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += p;
  return out;
}

TEST(TokenizerProperties, RoundTripAndNoSpecialIdsInOrdinaryMode) {
  const Tokenizer& t = golden_tokenizer();
  for (const auto& text : invented_texts()) {
    const auto ord = t.encode_ordinary(text);
    EXPECT_EQ(t.decode(ord), text) << text;
    for (const int32_t id : ord) EXPECT_FALSE(t.is_special(id)) << text;
    const auto sp = t.encode_with_special(text);
    EXPECT_EQ(t.decode(sp), text) << text;
    const std::string pieces = join(pieces_of(text));
    EXPECT_EQ(pieces, text);
  }
}

TEST(TokenizerProperties, NearMissMarkersAreOrdinaryEvenWithSpecials) {
  const Tokenizer& t = golden_tokenizer();
  for (const char* text :
       {"<|open|", "<|end_of_msg|", "<|OPEN|>", "< |open|>", "<|open |>", "|open|>", "[bos]",
        "[ BOS ]", "<|reserved_token_999999|>", "<|reserved_token_100|>", "<|end_of_msg"}) {
    EXPECT_EQ(t.encode_with_special(text), t.encode_ordinary(text)) << text;
  }
  // Exact markers are recognised, also back to back and inside other text.
  EXPECT_EQ(t.encode_with_special("<|open|>"), std::vector<int32_t>{100259});
  EXPECT_EQ(t.encode_with_special("<|open|><|open|"),
            (std::vector<int32_t>{100259} + t.encode_ordinary("<|open|")));
  EXPECT_EQ(t.encode_with_special("<<|open|>>"),
            t.encode_ordinary("<") + std::vector<int32_t>{100259} + t.encode_ordinary(">"));
  EXPECT_EQ(t.encode_with_special("<|sep|<|sep|>"),
            t.encode_ordinary("<|sep|") + std::vector<int32_t>{100261});
  EXPECT_EQ(t.encode_with_special("<|reserved_token_100300|>"), std::vector<int32_t>{100300});
  EXPECT_EQ(t.encode_with_special("[BOS][EOS]"), (std::vector<int32_t>{100256, 100257}));
  // Ordinary mode never produces them.
  const auto ord = t.encode_ordinary("<|open|>[BOS]<|reserved_token_100300|>");
  for (const int32_t id : ord) EXPECT_LT(id, t.n_ranks());
}

TEST(TokenizerProperties, PiecesFollowThePattern) {
  using V = std::vector<std::string>;
  // Contractions (any case) attach to the word before them; a bare one does not.
  EXPECT_EQ(pieces_of("DON'T don't I'M You'Re"), (V{"DON'T", " don't", " I'M", " You'Re"}));
  EXPECT_EQ(pieces_of("HTTPServer's"), (V{"HTTPServer's"}));
  EXPECT_EQ(pieces_of("x 's"), (V{"x", " '", "s"}));
  EXPECT_EQ(pieces_of("it'sx"), (V{"it's", "x"}));
  EXPECT_EQ(pieces_of("1234567 89"), (V{"123", "456", "7", " ", "89"}));
  EXPECT_EQ(pieces_of("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces_of("a   "), (V{"a", "   "}));
  EXPECT_EQ(pieces_of("a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(pieces_of("x  \n\ny"), (V{"x", "  \n\n", "y"}));
  EXPECT_EQ(pieces_of("if(x){\n"), (V{"if", "(x", "){\n"}));
  // Han runs are Script=Han only: ideographic punctuation is not part of the run.
  EXPECT_EQ(pieces_of("你好。世界、"), (V{"你好", "。", "世界", "、"}));
  EXPECT_EQ(pieces_of("用Python写"), (V{"用", "Python", "写"}));
  // U+0085 and U+3000 are whitespace for the pattern (Unicode White_Space).
  EXPECT_EQ(pieces_of("a\u3000\u3000b"), (V{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(pieces_of("a\u0085b"), (V{"a", "\u0085b"}));
}

// Python `_split_whitespaces_or_nonwhitespaces` over code points, written out independently.
std::vector<std::string> reference_guard_chunks(const std::string& text, std::size_t slice,
                                                std::size_t run) {
  std::vector<std::string> chars;
  for (std::size_t i = 0; i < text.size();) {
    const auto d = utf8::decode(text, i);
    chars.push_back(text.substr(i, d.len));
    i += d.len;
  }
  const auto space = [](const std::string& c) {
    const auto d = utf8::decode(c, 0);
    return d.status == utf8::Decoded::Status::ok && utf8::py_isspace(d.cp);
  };
  std::vector<std::string> out;
  if (chars.empty()) return {""};
  for (std::size_t s0 = 0; s0 < chars.size(); s0 += slice) {
    const std::vector<std::string> s(
        chars.begin() + static_cast<std::ptrdiff_t>(s0),
        chars.begin() + static_cast<std::ptrdiff_t>(std::min(chars.size(), s0 + slice)));
    std::size_t len = 0, start = 0;
    bool is_space = space(s[0]);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const bool now = space(s[i]);
      if (is_space != now) {
        len = 1;
        is_space = now;
      } else if (++len > run) {
        std::string piece;
        for (std::size_t k = start; k < i; ++k) piece += s[k];
        out.push_back(piece);
        start = i;
        len = 1;
      }
    }
    std::string piece;
    for (std::size_t k = start; k < s.size(); ++k) piece += s[k];
    out.push_back(piece);
  }
  return out;
}

TEST(TokenizerGuards, ChunkingMatchesTheReferenceAlgorithm) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b",  " ", "\t",   "\n",
                                             "é", "中", "😀", "\x1c", "\xff"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      // Long-ish runs of one class so the run limit triggers.
      const auto& c = alphabet[rng() % alphabet.size()];
      const int rep = static_cast<int>(rng() % 7) + 1;
      for (int k = 0; k < rep; ++k) text += c;
    }
    for (const std::size_t slice : {std::size_t{5}, std::size_t{13}, std::size_t{1000}}) {
      for (const std::size_t run : {std::size_t{1}, std::size_t{3}, std::size_t{8}}) {
        std::vector<std::string> got;
        for_each_guard_chunk(
            text, [&](std::string_view c) { got.emplace_back(c); }, slice, run);
        EXPECT_EQ(got, reference_guard_chunks(text, slice, run)) << text;
      }
    }
  }
}

TEST(TokenizerGuards, LongRunsAreSplitAt25000Characters) {
  const Tokenizer& t = golden_tokenizer();
  for (const std::string unit : {"a", " ", "中", "\n", "!"}) {
    std::string text;
    for (int i = 0; i < 60000; ++i) text += unit;
    std::vector<std::size_t> sizes;
    for_each_guard_chunk(text,
                         [&](std::string_view c) { sizes.push_back(c.size() / unit.size()); });
    EXPECT_EQ(sizes, (std::vector<std::size_t>{25000, 25000, 10000})) << unit;
    // Encoding the whole equals encoding the chunks one by one: no piece crosses a cut.
    std::string a, c;
    for (int i = 0; i < 25000; ++i) a += unit;
    for (int i = 0; i < 10000; ++i) c += unit;
    const auto whole = t.encode_ordinary(text);
    EXPECT_EQ(whole, t.encode_ordinary(a) + t.encode_ordinary(a) + t.encode_ordinary(c)) << unit;
    EXPECT_EQ(t.decode(whole), text);
  }
}

TEST(TokenizerGuards, SlicesOf400000Characters) {
  // Alternating classes so only the slice limit applies.
  std::string text;
  for (int i = 0; i < 450000 / 2; ++i) text += "a ";
  std::vector<std::size_t> sizes;
  for_each_guard_chunk(text, [&](std::string_view c) { sizes.push_back(c.size()); });
  EXPECT_EQ(sizes, (std::vector<std::size_t>{400000, 50000}));
  const Tokenizer& t = golden_tokenizer();
  EXPECT_EQ(t.decode(t.encode_ordinary(text)), text);
}

TEST(TokenizerProperties, InvalidUtf8IsEncodedByteLevel) {
  const Tokenizer& t = golden_tokenizer();
  const std::vector<std::string> texts = {"\xff",
                                          "\xc3",
                                          "abc\xff\xfe def",
                                          "\xe4\xb8",
                                          "ok\xed\xa0\x80surrogate",
                                          "\xc0\xaf overlong",
                                          "\xf4\x90\x80\x80 too big",
                                          "mixed 中\xe4文 \x80\x80",
                                          std::string(300, '\xff')};
  for (const auto& text : texts) {
    const auto ids = t.encode_ordinary(text);
    EXPECT_EQ(t.decode(ids), text);
    EXPECT_EQ(t.decode(t.encode_with_special(text)), text);
    EXPECT_EQ(join(pieces_of(text)), text);
  }
  // A lone invalid byte is its byte token.
  EXPECT_EQ(t.encode_ordinary("\xff"), std::vector<int32_t>{*t.rank_of("\xff")});
}

// The rewrite of `[X&&[^\p{Han}]]` as one negated class equals the look-ahead spelling on every
// code point.
TEST(TokenizerPattern, IntersectionRewriteIsExactOnEveryCodePoint) {
  const auto compile = [](const std::string& p) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    EXPECT_NE(c, nullptr) << p;
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    return c;
  };
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {R"(^[^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]$)",
       R"(^(?:(?!\p{sc:Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])$)"},
      {R"(^[^\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]$)",
       R"(^(?:(?!\p{sc:Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])$)"},
  };
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  for (const auto& [a, b] : pairs) {
    pcre2_code* ca = compile(a);
    pcre2_code* cb = compile(b);
    int mismatches = 0;
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string s;
      utf8::append(s, cp);
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
      const bool ma = pcre2_match(ca, subj, s.size(), 0, 0, md, nullptr) >= 0;
      const bool mb = pcre2_match(cb, subj, s.size(), 0, 0, md, nullptr) >= 0;
      if (ma != mb && ++mismatches < 5)
        ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp);
    }
    EXPECT_EQ(mismatches, 0);
    pcre2_code_free(ca);
    pcre2_code_free(cb);
  }
  pcre2_match_data_free(md);
}

TEST(TokenizerPattern, FullPatternsAgreeOnRandomText) {
  // The compiled pattern against the look-ahead form, piece by piece, on random mixed text.
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string p = kimi_pcre2_pattern_lookahead_form();
  pcre2_code* alt = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  ASSERT_NE(alt, nullptr);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const std::vector<std::string> pool = {
      "a",      "Z", "ǅ",  "ʰ", "中", "々",     "〇", "。", "ー",     "ア", "é",
      "\u0301", "1", "٣",  "Ⅻ", " ",  "\n",     "\r", "\t", "\u3000", "'",  "s",
      "S",      "t", "ll", "!", "😀",  "\u200d", "_",  "-",  "ß",      "Ω",  "ω"};
  std::mt19937 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 30) + 1;
    for (int i = 0; i < n; ++i) text += pool[rng() % pool.size()];
    std::vector<std::string> expected;
    for (std::size_t pos = 0; pos < text.size();) {
      ASSERT_GE(pcre2_match(alt, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, md,
                            nullptr),
                0);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      ASSERT_EQ(ov[0], pos) << text;  // valid UTF-8 leaves no gaps
      expected.push_back(text.substr(ov[0], ov[1] - ov[0]));
      pos = ov[1];
    }
    EXPECT_EQ(pieces_of(text), expected) << text;
  }
  pcre2_match_data_free(md);
  pcre2_code_free(alt);
}

TEST(TokenizerBpe, QuadraticAndHeapMergesAgree) {
  const Tokenizer& t = golden_tokenizer();
  const auto rank = [&](std::string_view s) { return t.rank_of(s).value_or(-1); };
  std::mt19937 rng(3);
  const std::vector<std::string> pool = {"the",  " ",  "ing", "a",  "e",    "中",
                                         "\xff", "ab", "000", "\n", "tion", "😀"};
  bpe::Scratch s1, s2;
  for (int iter = 0; iter < 500; ++iter) {
    std::string piece;
    const int n = static_cast<int>(rng() % 40) + 2;
    for (int i = 0; i < n; ++i) piece += pool[rng() % pool.size()];
    std::vector<int32_t> a, b;
    bpe::merge_quadratic(piece, rank, a, s1);
    bpe::merge_heap(piece, rank, b, s2);
    EXPECT_EQ(a, b) << piece;
    EXPECT_EQ(t.decode(a), piece);
  }
}

TEST(TokenizerProperties, ErrorsForInvalidIds) {
  const Tokenizer& t = golden_tokenizer();
  EXPECT_EQ(expect_error([&] {
              t.decode(std::vector<int32_t>{1, 100512});
            }),
            "token id 100512 is out of range: the vocabulary has 100512 ids (0..100511)");
  EXPECT_EQ(expect_error([&] { t.token_bytes(-1); }),
            "token id -1 is out of range: the vocabulary has 100512 ids (0..100511)");
}

// ---------------------------------------------------------------------------------------------
// Incremental decoding.

TEST(IncrementalDecoder, HoldsBackSplitCharacters) {
  const Tokenizer& t = golden_tokenizer();
  const auto byte = [&](const char* b) { return *t.rank_of(b); };
  IncrementalDecoder d(t);
  EXPECT_EQ(d.push(byte("\xc3")), "");
  EXPECT_TRUE(d.has_pending());
  EXPECT_EQ(d.push(byte("\xa9")), "é");
  // A 4-byte emoji one byte at a time, then as a 2-byte token and two single bytes.
  EXPECT_EQ(d.push(byte("\xf0")), "");
  EXPECT_EQ(d.push(byte("\x9f")), "");
  EXPECT_EQ(d.push(byte("\x98")), "");
  EXPECT_EQ(d.push(byte("\x80")), "😀");
  EXPECT_EQ(d.push(*t.rank_of("\xf0\x9f")), "");
  EXPECT_EQ(d.push(byte("\x98")), "");
  EXPECT_EQ(d.push(byte("\x80")), "😀");
  // Text after a held prefix comes out with it.
  EXPECT_EQ(d.push(byte("\xe4")), "");
  EXPECT_EQ(d.push(byte("\xb8")), "");
  EXPECT_EQ(d.push(byte("\xad")), "中");
  // Invalid bytes become U+FFFD at once; a truncated tail only at flush.
  EXPECT_EQ(d.push(byte("\xff")), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte("\xe4")), "");
  EXPECT_EQ(d.push(byte("a")),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(d.push(*t.rank_of("\xe4\xb8")), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_FALSE(d.has_pending());
  EXPECT_EQ(d.push(100259), "<|open|>");
}

TEST(IncrementalDecoder, StreamingEqualsDecodeOnGoldenTexts) {
  const Tokenizer& t = golden_tokenizer();
  const auto cases = golden_cases();
  ASSERT_GE(cases["cases"].size(), 20u);
  for (const auto& c : cases["cases"]) {
    IncrementalDecoder d(t);
    std::string streamed;
    for (const int32_t id : ids_of(c["with_special"])) {
      const std::string part = d.push(id);
      EXPECT_TRUE(utf8::is_valid(part));
      streamed += part;
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, c["text"].get<std::string>());
  }
  // Lossy for invalid input, like Python's decode("utf-8", "replace").
  IncrementalDecoder d(t);
  std::string out;
  for (const int32_t id : t.encode_ordinary("a\xff\xe4\xb8z\xf0\x9f")) out += d.push(id);
  out += d.flush();
  EXPECT_EQ(out, "a\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------
// Loader errors.

std::string byte_ranks(int extra_lines_from = 256) {
  std::string out;
  for (int b = 0; b < 256; ++b) {
    out += base64_of(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  }
  (void)extra_lines_from;
  return out;
}

const char* kConfig =
    R"({"added_tokens_decoder": {"258": {"content": "<|end_of_msg|>"}, "259": {"content": "<|open|>"}}})";

std::string make_dir(const std::string& model, const std::string& config) {
  const std::string dir = temp_dir("tok-load");
  spit(dir + "/tiktoken.model", model);
  spit(dir + "/tokenizer_config.json", config);
  return dir;
}

std::string load_error(const std::string& model, const std::string& config) {
  const std::string dir = make_dir(model, config);
  return expect_error([&] { Tokenizer::load(dir); });
}

TEST(TokenizerLoad, MinimalFolderLoads) {
  const std::string dir = make_dir(byte_ranks() + base64_of("ab") + " 256\n", kConfig);
  const Tokenizer t = Tokenizer::load(dir);
  EXPECT_EQ(t.n_ranks(), 257);
  EXPECT_EQ(t.vocab_size(), 513);
  EXPECT_EQ(t.special_id("<|end_of_msg|>"), 258);
  EXPECT_EQ(t.special_id("<|reserved_token_257|>"), 257);
  EXPECT_EQ(t.encode_ordinary("abab"), (std::vector<int32_t>{256, 256}));
}

TEST(TokenizerLoad, ErrorsNameTheFileAndLine) {
  const std::string ok_cfg = R"({"added_tokens_decoder": {}})";
  std::string e = load_error(byte_ranks() + "YWJ=x 256\n", ok_cfg);
  EXPECT_NE(e.find("tiktoken.model line 257: invalid base64 \"YWJ=x\""), std::string::npos) << e;
  e = load_error(byte_ranks() + "YW*i 256\n", ok_cfg);
  EXPECT_NE(e.find("tiktoken.model line 257: invalid base64"), std::string::npos) << e;
  e = load_error(byte_ranks() + base64_of("ab") + " 258\n", ok_cfg);
  EXPECT_NE(
      e.find("tiktoken.model line 257: rank 258 where 256 was expected (ranks must be contiguous"),
      std::string::npos)
      << e;
  e = load_error(byte_ranks() + base64_of("a") + " 256\n", ok_cfg);
  EXPECT_NE(e.find("tiktoken.model line 257: duplicate token (same bytes as rank 97, "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("line 98)"), std::string::npos) << e;
  e = load_error(byte_ranks() + base64_of("ab") + "\n", ok_cfg);
  EXPECT_NE(e.find("tiktoken.model line 257: expected \"<base64 token> <rank>\""),
            std::string::npos)
      << e;
  e = load_error(byte_ranks() + base64_of("ab") + " -1\n", ok_cfg);
  EXPECT_NE(e.find("line 257: invalid rank \"-1\""), std::string::npos) << e;
  // Missing single byte.
  std::string no_ff;
  for (int b = 0; b < 255; ++b)
    no_ff += base64_of(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  no_ff += base64_of("ab") + " 255\n";
  e = load_error(no_ff, ok_cfg);
  EXPECT_NE(e.find("byte 0xFF has no token; every single byte must be a rank"), std::string::npos)
      << e;
  // Config problems.
  e = load_error(byte_ranks(), "{\"added_tokens_decoder\": {");
  EXPECT_NE(e.find("tokenizer_config.json: invalid JSON: "), std::string::npos) << e;
  EXPECT_NE(e.find("line 1, column"), std::string::npos) << e;
  e = load_error(byte_ranks(), R"({"added_tokens_decoder": {"100": {"content": "<|x|>"}}})");
  EXPECT_NE(e.find("tokenizer_config.json: added_tokens_decoder id 100 is outside the special "
                   "range [256, 512) "
                   "that follows the 256 ranks"),
            std::string::npos)
      << e;
  e = load_error(byte_ranks(), R"({"added_tokens_decoder": {"512": {"content": "<|x|>"}}})");
  EXPECT_NE(e.find("id 512 is outside the special range [256, 512)"), std::string::npos) << e;
  e = load_error(byte_ranks(), R"({"added_tokens_decoder": {"abc": {"content": "<|x|>"}}})");
  EXPECT_NE(e.find("added_tokens_decoder key \"abc\" is not a token id"), std::string::npos) << e;
  e = load_error(byte_ranks(), R"({"added_tokens_decoder": {"257": {"text": "<|x|>"}}})");
  EXPECT_NE(e.find("added_tokens_decoder[\"257\"] must be an object with a string \"content\""),
            std::string::npos)
      << e;
  e = load_error(
      byte_ranks(),
      R"({"added_tokens_decoder": {"256": {"content": "<|x|>"}, "257": {"content": "<|x|>"}}})");
  EXPECT_NE(e.find("special tokens 256 and 257 have the same name \"<|x|>\""), std::string::npos)
      << e;
  e = load_error(byte_ranks(), R"({"bos_token": "[BOS]"})");
  EXPECT_NE(e.find("tokenizer_config.json: missing \"added_tokens_decoder\""), std::string::npos)
      << e;
  e = load_error("", ok_cfg);
  EXPECT_NE(e.find("tiktoken.model: no ranks"), std::string::npos) << e;
  // Missing files.
  const std::string empty = temp_dir("tok-empty");
  e = expect_error([&] { Tokenizer::load(empty); });
  EXPECT_NE(e.find("cannot read " + empty + "/tiktoken.model"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------
// Synthetic tokenizer.

TEST(SyntheticTokenizer, WritesALoadableK3StyleTokenizer) {
  for (const int32_t vocab : {512, 1000, 4096}) {
    const std::string dir = temp_dir("synth");
    write_synthetic_tokenizer(dir, vocab);
    const Tokenizer t = Tokenizer::load(dir);
    EXPECT_EQ(t.vocab_size(), vocab);
    const int32_t first = vocab - 256;
    EXPECT_EQ(t.n_ranks(), first);
    for (int b = 0; b < 256; ++b) EXPECT_EQ(t.token_bytes(b), std::string(1, static_cast<char>(b)));
    EXPECT_EQ(t.special_id("[BOS]"), first + 0);
    EXPECT_EQ(t.special_id("[EOS]"), first + 1);
    EXPECT_EQ(t.special_id("<|end_of_msg|>"), first + 2);
    EXPECT_EQ(t.special_id("<|open|>"), first + 3);
    EXPECT_EQ(t.special_id("<|close|>"), first + 4);
    EXPECT_EQ(t.special_id("<|sep|>"), first + 5);
    EXPECT_EQ(t.special_id("[start_header_id]"), first + 6);
    EXPECT_EQ(t.special_id("[end_header_id]"), first + 7);
    EXPECT_EQ(t.special_id("[EOT]"), first + 9);
    EXPECT_EQ(t.special_id("<|media_begin|>"), first + 18);
    EXPECT_EQ(t.special_id("<|media_content|>"), first + 19);
    EXPECT_EQ(t.special_id("<|media_end|>"), first + 20);
    EXPECT_EQ(t.special_id("<|media_pad|>"), first + 21);
    EXPECT_EQ(t.special_id("[UNK]"), first + 254);
    EXPECT_EQ(t.special_id("[PAD]"), first + 255);
    EXPECT_EQ(t.token_bytes(first + 8), fmt::format("<|reserved_token_{}|>", first + 8));
    for (const auto& text : invented_texts()) EXPECT_EQ(t.decode(t.encode_ordinary(text)), text);
    const std::string marked =
        "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>";
    EXPECT_EQ(t.decode(t.encode_with_special(marked)), marked);
    if (vocab == 4096) {  // merges were learned: common words are short
      EXPECT_LT(t.encode_ordinary("The tokenizer returns the words").size(), 12u);
    }
  }
}

TEST(SyntheticTokenizer, IsDeterministicAndChecksItsSize) {
  const std::string a = temp_dir("synth-a"), b = temp_dir("synth-b");
  write_synthetic_tokenizer(a, 2048);
  write_synthetic_tokenizer(b, 2048);
  EXPECT_EQ(slurp(a + "/tiktoken.model"), slurp(b + "/tiktoken.model"));
  EXPECT_EQ(slurp(a + "/tokenizer_config.json"), slurp(b + "/tokenizer_config.json"));
  const std::string e = expect_error([&] { write_synthetic_tokenizer(temp_dir("synth-c"), 511); });
  EXPECT_NE(e.find("vocab_size 511 must be in [512, 1048576]"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------
// The command line.

TEST(TokenizeCommand, EmptyTextAndExactDecode) {
  auto r = run_deltafin({"tokenize", "--model", tok_dir(), "--text", ""});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[]\n");
  const std::string dir = temp_dir("tok-cli");
  spit(dir + "/empty.txt", "");
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--file", dir + "/empty.txt"});
  EXPECT_EQ(r.out, "[]\n");
  // --file is byte for byte: a trailing newline and invalid UTF-8 survive.
  const std::string bytes = "line\n\xff\xfe tail\n";
  spit(dir + "/bytes.txt", bytes);
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--file", dir + "/bytes.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = ids_of(nlohmann::json::parse(r.out));
  EXPECT_EQ(ids, golden_tokenizer().encode_ordinary(bytes));
  spit(dir + "/ids.json", nlohmann::json(ids).dump());
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--file", dir + "/ids.json"});
  EXPECT_EQ(r.out, bytes);
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--text", "[]"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  // Specials only with --special.
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--text", "<|open|>"});
  EXPECT_EQ(ids_of(nlohmann::json::parse(r.out)), golden_tokenizer().encode_ordinary("<|open|>"));
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--special", "--text", "<|open|>"});
  EXPECT_EQ(r.out, "[100259]\n");
  // Text may start with dashes.
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--text", "-5 --x"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(nlohmann::json::parse(r.out)), golden_tokenizer().encode_ordinary("-5 --x"));
}

TEST(TokenizeCommand, Errors) {
  auto r = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--text", "[1, 100512]"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(
      r.err,
      "deltafin: token id 100512 is out of range: the vocabulary has 100512 ids (0..100511)\n");
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--text", "[1, \"a\"]"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--text: element 1 is \"a\", expected an integer token id"),
            std::string::npos)
      << r.err;
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--decode", "--text", "not json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--text: expected a JSON array of token ids"), std::string::npos) << r.err;
  r = run_deltafin({"tokenize", "--model", tok_dir()});
  EXPECT_EQ(r.exit_code, 2);  // a usage error
  EXPECT_EQ(r.err,
            "deltafin: tokenize: give exactly one of --text and --file (see deltafin tokenize "
            "--help)\n");
  r = run_deltafin({"tokenize", "--model", tok_dir(), "--file", "/nonexistent/x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--file /nonexistent/x: cannot open for reading"), std::string::npos)
      << r.err;
  const std::string empty = temp_dir("tok-cli-empty");
  r = run_deltafin({"tokenize", "--model", empty, "--text", "a"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tiktoken.model"), std::string::npos) << r.err;
  r = run_deltafin({"tokenize", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--special"), std::string::npos);
}

}  // namespace
}  // namespace deltafin
