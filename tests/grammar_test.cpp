// The grammar layer (src/grammar): the GBNF parser, the pushdown automaton and the matcher.
// The matcher is checked against a reference recogniser written here over the IR (recursive,
// memoised, on whole strings: nothing shared with the automaton), its masks against a direct
// token-by-token simulation, and on the 100k-token test tokenizer against JSON documents
// encoded by the real tokenizer.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "grammar/pda.h"
#include "server_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin::grammar {
namespace {

// ---- reference recogniser over the IR -------------------------------------------------------

class Reference {
 public:
  explicit Reference(const Grammar& g) : g_(g) {}

  bool accepts(const std::string& s) {
    s_ = s;
    memo_.clear();
    const auto ends = rule(g_.root, 0);
    return ends.count(s.size()) > 0;
  }

 private:
  std::set<size_t> rule(uint32_t r, size_t pos) {
    const auto key = std::make_pair(r, pos);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    memo_[key] = {};  // guards against (forbidden) left recursion looping
    auto out = match(g_.rules[r], pos);
    memo_[key] = out;
    return out;
  }

  std::set<size_t> match(const ExprPtr& e, size_t pos) {
    switch (e->kind) {
      case ExprKind::empty:
        return {pos};
      case ExprKind::nothing:
        return {};
      case ExprKind::bytes:
        if (s_.compare(pos, e->bytes.size(), e->bytes) == 0 && pos + e->bytes.size() <= s_.size())
          return {pos + e->bytes.size()};
        return {};
      case ExprKind::byte_class:
        if (pos < s_.size()) {
          const auto b = static_cast<uint8_t>(s_[pos]);
          for (const auto& r : e->byte_ranges)
            if (b >= r.lo && b <= r.hi) return {pos + 1};
        }
        return {};
      case ExprKind::char_class: {
        if (pos >= s_.size()) return {};
        const auto d = utf8::decode(s_, pos);
        if (d.status != utf8::Decoded::Status::ok) return {};
        for (const auto& r : e->char_ranges)
          if (d.cp >= r.lo && d.cp <= r.hi) return {pos + d.len};
        return {};
      }
      case ExprKind::seq: {
        std::set<size_t> cur{pos};
        for (const auto& it : e->items) {
          std::set<size_t> next;
          for (size_t p : cur) {
            auto r = match(it, p);
            next.insert(r.begin(), r.end());
          }
          cur = std::move(next);
        }
        return cur;
      }
      case ExprKind::alt: {
        std::set<size_t> out;
        for (const auto& it : e->items) {
          auto r = match(it, pos);
          out.insert(r.begin(), r.end());
        }
        return out;
      }
      case ExprKind::repeat: {
        std::set<size_t> out, cur{pos};
        for (uint32_t i = 0; i <= std::min<uint32_t>(e->max, 10000); ++i) {
          if (i >= e->min) out.insert(cur.begin(), cur.end());
          if (i == e->max || cur.empty()) break;
          std::set<size_t> next;
          for (size_t p : cur) {
            auto r = match(e->items[0], p);
            for (size_t q : r)
              if (q > p || i < e->min) next.insert(q);
          }
          cur = std::move(next);
        }
        return out;
      }
      case ExprKind::ref:
        return rule(e->rule, pos);
      case ExprKind::token:
      case ExprKind::intersect:
        ADD_FAILURE() << "the reference handles neither tokens nor intersections";
        return {};
    }
    return {};
  }

  const Grammar& g_;
  std::string s_;
  std::map<std::pair<uint32_t, size_t>, std::set<size_t>> memo_;
};

// ---- vocabularies -----------------------------------------------------------------------------

// All 256 single bytes plus multi-byte tokens cut from `texts` (and a few special tokens).
std::shared_ptr<const TokenVocab> small_vocab(const std::vector<std::string>& texts,
                                              int specials = 0, uint32_t seed = 1) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  std::set<std::string> seen(bytes.begin(), bytes.end());
  std::mt19937 rng(seed);
  for (const auto& t : texts) {
    for (size_t i = 0; i < t.size(); ++i) {
      for (size_t len = 2; len <= 6 && i + len <= t.size(); ++len) {
        if (rng() % 3 == 0 && seen.insert(t.substr(i, len)).second)
          bytes.push_back(t.substr(i, len));
      }
    }
  }
  std::vector<bool> special(bytes.size(), false);
  for (int i = 0; i < specials; ++i) {
    bytes.push_back(fmt::format("<|s{}|>", i));
    special.push_back(true);
  }
  return std::make_shared<const TokenVocab>(std::move(bytes), std::move(special));
}

std::shared_ptr<const CompiledGrammar> compile(const std::string& gbnf,
                                               std::shared_ptr<const TokenVocab> v) {
  const Grammar g = parse_gbnf(gbnf, &v->lookup());
  return std::make_shared<const CompiledGrammar>(Pda::compile(g), v);
}

// Feeds `s` one byte token at a time; whether every byte is accepted and the grammar may end.
bool matcher_accepts(const std::shared_ptr<const CompiledGrammar>& cg, const std::string& s) {
  Matcher m(cg, {});
  for (const char c : s) {
    if (!m.accept(static_cast<uint8_t>(c))) return false;
  }
  return m.complete();
}

// The mask must equal the set of tokens the direct simulation allows.
void expect_mask_matches_direct(Matcher& m, const TokenVocab& v) {
  TokenMask mask;
  m.fill_mask(mask);
  for (int32_t t = 0; t < v.size(); ++t) {
    ASSERT_EQ(mask.test(t), m.allows(t)) << "token " << t << " `" << v.bytes(t) << "`";
  }
}

const char* kJsonGbnf = R"G(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)G";

struct Case {
  const char* name;
  const char* gbnf;
  std::vector<std::string> good, bad;
};

std::vector<Case> cases() {
  return {
      {"json",
       kJsonGbnf,
       {R"G({"a": [1, 2.5, -3e4], "b": {"c": null}})G", "{}", R"G({"k": "\u00e9\n"})G",
        "{\"x\": \"caf\xC3\xA9\"}"},
       {"{", R"G({"a" 1})G", "[]", R"G({"a": tru})G", "{\"a\": \"\x01\"}"}},
      {"arith",
       R"G(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
)G",
       {"1+2*3", "(1+2)*3", "((4))", "10/2-3"},
       {"1+", "(1+2", "+1", "1++2", ""}},
      {"list",
       "root ::= (\"- \" item)+\nitem ::= [^\\n]+ \"\\n\"\n",
       {"- a\n", "- one\n- two\n", "- \xE2\x82\xAC\n"},
       {"- \n", "-a\n", "- a", ""}},
      {"counts",
       "root ::= [a-c]{2,4} \"x\"{3} ([0-9] \",\"?){0,3}\n",
       {"abxxx", "abcaxxx1,2,3", "ccxxx9"},
       {"axxx", "abcabxxx", "abxx", "abxxx1,2,3,4"}},
      {"prefixes",
       "root ::= \"abc\" | \"abd\" | \"ab\" suffix | \"a\"\nsuffix ::= \"x\"*\n",
       {"abc", "abd", "ab", "abxxx", "a"},
       {"abcx", "b", "abx y"}},
      {"nullable",
       "root ::= a b c\na ::= \"x\"?\nb ::= (\"y\" | )\nc ::= \"z\"*\n",
       {"", "x", "y", "zz", "xyz", "xzz"},
       {"yx", "zx", "xx"}},
      {"unicode",
       "root ::= [\\u00C0-\\u00FF\\u4E00-\\u9FFF\\U0001F600-\\U0001F64F]+ [^a-z]\n",
       {"\xC3\x80"
        "A",
        "\xE4\xB8\x80\xF0\x9F\x98\x80"
        "1",
        "\xC3\xBF\xC3\xBF"
        "\xC3\x80"},
       {"a",
        "\xC3\x80"
        "a",
        "\xF0\x9F\x99\x90"
        "1"}},
      {"any", "root ::= \"<\" .* \">\"\n", {"<>", "<a>b>", "<\xE2\x82\xAC>"}, {"<", "a<>"}},
      {"recursion", "root ::= \"(\" root* \")\"\n", {"()", "(()())", "((()))"}, {"(", "())", ")("}},
  };
}

TEST(GbnfParse, SyntaxOfLlamaCpp) {
  const Grammar g = parse_gbnf(R"G(# comment
root ::= item+ ( # groups may span lines
    "," item
  )* [^\x00-\x1F\]\-]? . "\u00e9\U0001F600\t\"\\"
item ::= [a-z] |
  [A-Z]{2} | "0"{1,} | "1"{,2} | "2"{3}
other_name-2 ::= "x"
)G");
  EXPECT_EQ(g.names[g.root], "root");
  const std::string printed = to_gbnf(g);
  EXPECT_NE(printed.find("item ::= [a-z] | [A-Z]{2} | \"0\"+ | \"1\"{0,2} | \"2\"{3}"),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("other_name-2 ::= \"x\""), std::string::npos) << printed;
}

TEST(GbnfParse, ErrorsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"root ::= foo\n", "rule `foo` is used but never defined"},
      {"item ::= \"x\"\n", "no `root` rule"},
      {"root ::= \"abc\n", "unterminated string literal"},
      {"root ::= [abc\n", "unterminated character class"},
      {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape \\q"},
      {"root ::= \"a\"{2001}\n", "repetition count above the limit of 2000"},
      {"root ::= \"a\"{3,2}\n", "n < m"},
      {"root ::= (\"a\"\n", "expected )"},
      {"root ::= * \"a\"\n", "`*` must follow an item"},
      {"root \"a\"\n", "expected ::="},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
      {"root ::= <foo>\n", "token references need a tokenizer"},
      {"root ::= \"\\uD800\"\n", "not a Unicode scalar value"},
      {"root ::= \"a\" )\n", "expected the end of the line"},
      {"root ::= " + std::string(101, '(') + "\"a\"" + std::string(101, ')'),
       "groups nested deeper than"},
  };
  for (const auto& [text, msg] : bad) {
    try {
      parse_gbnf(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos)
          << text << " gave: " << e.what();
    }
  }
  EXPECT_THROW(parse_gbnf(std::string(kMaxGrammarBytes + 1, ' ')), InvalidArgument);
  EXPECT_THROW(parse_gbnf("root ::= \"\xFF\"\n"), InvalidArgument);
}

TEST(GrammarCompile, RefusesLeftRecursionAndGrammarsThatCannotEnd) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"root ::= root \"a\" | \"b\"\n", "rule `root` is left-recursive"},
      {"root ::= x\nx ::= y? \"a\" | \"b\"\ny ::= \"\" | x \"c\"\n", "left-recursive"},
      {"root ::= \"a\" root\n", "can never be completed"},
      {"root ::= \"a\" x\nx ::= \"b\" x\n", "rule `x` has no way to end"},
  };
  for (const auto& [text, msg] : bad) {
    try {
      Pda::compile(parse_gbnf(text));
      ADD_FAILURE() << "compiled: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos)
          << text << " gave: " << e.what();
    }
  }
  // Right recursion and a rule unproductive in only one alternative are fine.
  EXPECT_NO_THROW(
      Pda::compile(parse_gbnf("root ::= \"a\" root | \"b\" | dead\ndead ::= \"x\" dead\n")));
  Limits small;
  small.max_nodes = 50;
  EXPECT_THROW(Pda::compile(parse_gbnf("root ::= [a-z]{0,500}\n"), small), InvalidArgument);
}

TEST(GrammarMatch, AgreesWithTheReferenceRecogniser) {
  std::mt19937 rng(7);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto v = small_vocab({});
    const Grammar g = parse_gbnf(c.gbnf);
    const auto cg = std::make_shared<const CompiledGrammar>(Pda::compile(g), v);
    Reference ref(g);
    for (const auto& s : c.good) {
      EXPECT_TRUE(ref.accepts(s)) << "reference rejects good " << s;
      EXPECT_TRUE(matcher_accepts(cg, s)) << "matcher rejects good " << s;
    }
    for (const auto& s : c.bad) {
      EXPECT_FALSE(ref.accepts(s)) << "reference accepts bad " << s;
      EXPECT_FALSE(matcher_accepts(cg, s)) << "matcher accepts bad " << s;
    }
    // Random walks through the automaton's own masks, then mutations of what they produce:
    // acceptance must agree on all of them.
    for (int walk = 0; walk < 40; ++walk) {
      Matcher m(cg, {});
      std::string s;
      TokenMask mask;
      const int len = static_cast<int>(rng() % 24);
      for (int i = 0; i < len; ++i) {
        m.fill_mask(mask);
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < 256; ++t)
          if (mask.test(t)) ok.push_back(t);
        if (ok.empty()) break;
        const int32_t t = ok[rng() % ok.size()];
        ASSERT_TRUE(m.accept(t));
        s += static_cast<char>(t);
      }
      EXPECT_EQ(m.complete(), ref.accepts(s)) << "`" << s << "`";
      std::string mutated = s;
      if (!mutated.empty()) mutated[rng() % mutated.size()] = "a1(\",{}x "[rng() % 9];
      mutated.insert(rng() % (mutated.size() + 1), 1, "a1(\",{}x "[rng() % 9]);
      EXPECT_EQ(matcher_accepts(cg, mutated), ref.accepts(mutated)) << "`" << mutated << "`";
    }
  }
}

TEST(GrammarMatch, MasksEqualTheDirectSimulation) {
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> texts(c.good.begin(), c.good.end());
    texts.insert(texts.end(), c.bad.begin(), c.bad.end());
    const auto v = small_vocab(texts, 0, 3);
    const auto cg = compile(c.gbnf, v);
    for (int walk = 0; walk < 6; ++walk) {
      Matcher m(cg, {});
      TokenMask mask;
      for (int step = 0; step < 12; ++step) {
        expect_mask_matches_direct(m, *v);
        m.fill_mask(mask);
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < v->size(); ++t)
          if (mask.test(t)) ok.push_back(t);
        if (ok.empty()) break;
        ASSERT_TRUE(m.accept(ok[rng() % ok.size()]));
      }
    }
  }
}

TEST(GrammarMatch, CharactersSplitAcrossTokens) {
  // "é" is C3 A9; tokens are single bytes and a few pieces that cut characters in the middle.
  const auto v = std::make_shared<const TokenVocab>(
      std::vector<std::string>{"\xC3", "\xA9", "\xC3\xA9", "\xA9\xC3", "a", "\xE2\x82", "\xAC"},
      std::vector<bool>(7, false));
  const auto cg = compile("root ::= (\"\xC3\xA9\" | \"\xE2\x82\xAC\")+ \"a\"\n", v);
  Matcher m(cg, {});
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_TRUE(mask.test(0) && mask.test(2) && mask.test(5));
  EXPECT_FALSE(mask.test(1) || mask.test(3) || mask.test(4) || mask.test(6));
  ASSERT_TRUE(m.accept(0));  // half a character
  m.fill_mask(mask);
  EXPECT_TRUE(mask.test(1) && mask.test(3));  // its second byte, alone or with the next start
  EXPECT_FALSE(mask.test(0) || mask.test(4) || mask.test(2));
  ASSERT_TRUE(m.accept(3));
  ASSERT_TRUE(m.accept(1));
  ASSERT_FALSE(m.complete());
  ASSERT_TRUE(m.accept(4));
  EXPECT_TRUE(m.complete());
}

TEST(GrammarMatch, SpecialTokensAreSingleSymbolsAndStopsNeedACompleteGrammar) {
  const auto v = small_vocab({"<|s0|>hello"}, 3);
  const int32_t s0 = v->size() - 3, s1 = v->size() - 2, stop = v->size() - 1;
  const auto cg = compile("root ::= <|s0|> \"hi\" !<|s1|>* <|s1|>\n", v);
  Matcher m(cg, {stop});
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_EQ(mask.count(), 1);
  EXPECT_TRUE(mask.test(s0));  // the special, never its name spelled as text
  EXPECT_FALSE(m.accept('<'));
  ASSERT_TRUE(m.accept(s0));
  ASSERT_TRUE(m.accept('h'));
  ASSERT_TRUE(m.accept('i'));
  m.fill_mask(mask);
  // Any token (s1 by its own element), the stop token excluded (the grammar cannot end yet).
  EXPECT_EQ(mask.count(), v->size() - 1);
  EXPECT_TRUE(mask.test(s0));
  EXPECT_TRUE(mask.test(s1));
  EXPECT_FALSE(mask.test(stop));
  ASSERT_TRUE(m.accept('x'));
  ASSERT_TRUE(m.accept(s1));
  EXPECT_TRUE(m.complete());
  m.fill_mask(mask);
  EXPECT_EQ(mask.count(), 1);
  EXPECT_TRUE(mask.test(stop));
  EXPECT_TRUE(m.accept(stop));
  EXPECT_TRUE(m.finished());
}

TEST(GrammarMatch, LazyGrammarStartsAtItsTrigger) {
  const auto v = small_vocab({"call(x)"}, 2);
  const int32_t s0 = v->size() - 2;
  const auto cg = compile("root ::= \"(\" [a-z]+ \")\"\n", v);
  Matcher m(cg, {}, {'c', 'a', 'l', 'l', kTokenSymbol + s0});
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_EQ(mask.count(), v->size());
  for (const char c : std::string("free (text) call"))
    ASSERT_TRUE(m.accept(static_cast<uint8_t>(c)));
  EXPECT_FALSE(m.active());
  ASSERT_TRUE(m.accept(s0));
  EXPECT_TRUE(m.active());
  EXPECT_FALSE(m.complete());
  m.fill_mask(mask);
  EXPECT_TRUE(mask.test('('));
  EXPECT_FALSE(mask.test('x'));
  for (const char c : std::string("(ab)")) ASSERT_TRUE(m.accept(static_cast<uint8_t>(c)));
  EXPECT_TRUE(m.complete());
}

TEST(GrammarMatch, RealTokenizerAcceptsEncodedJsonAndMasksAgree) {
  const Tokenizer& tok = test::k3_tokenizer();
  const auto v = TokenVocab::of(tok);
  ASSERT_GE(v->size(), 100000);
  const auto cg = compile(kJsonGbnf, v);
  const std::vector<std::string> docs = {
      R"G({"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry"], "ok": true})G",
      "{\"city\": \"Z\xC3\xBCrich\", \"temp\": -3.5e2, \"emoji\": \"\xF0\x9F\x98\x80\", \"n\": "
      "null}",
      "{\n  \"a\": {\"b\": [1, 2, {\"c\": \"\\u00e9\\n\"}]},\n  \"d\": []\n}",
  };
  std::mt19937 rng(5);
  for (const auto& doc : docs) {
    ASSERT_FALSE(nlohmann::json::parse(doc).is_discarded());
    Matcher m(cg, {v->size() - 1});
    TokenMask mask;
    for (const int32_t t : tok.encode_ordinary(doc)) {
      m.fill_mask(mask);
      ASSERT_TRUE(mask.test(t)) << "token `" << tok.token_bytes(t) << "` of " << doc;
      // Spot-check the mask against the direct simulation.
      for (int k = 0; k < 200; ++k) {
        const auto r = static_cast<int32_t>(rng() % static_cast<uint32_t>(v->size()));
        ASSERT_EQ(mask.test(r), m.allows(r)) << "token " << r << " `" << v->bytes(r) << "`";
      }
      ASSERT_TRUE(m.accept(t));
    }
    EXPECT_TRUE(m.complete());
  }
  // Random walks over the real vocabulary end in valid JSON: after a while they prefer
  // closing tokens (when allowed), so that they finish.
  const int32_t stop = v->size() - 1;
  std::vector<int32_t> closing = {stop};
  for (const char* c : {"}", "]", "\"", ":", "0"}) closing.push_back(tok.encode_ordinary(c)[0]);
  int completed = 0;
  for (int walk = 0; walk < 20; ++walk) {
    Matcher m(cg, {stop});
    TokenMask mask;
    std::string out;
    for (int step = 0; step < 400 && !m.finished(); ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < mask.size(); ++t)
        if (mask.test(t)) ok.push_back(t);
      ASSERT_FALSE(ok.empty());
      int32_t t = ok[rng() % ok.size()];
      if (step > 12) {
        for (const int32_t c : closing) {
          if (mask.test(c)) {
            t = c;
            break;
          }
        }
      }
      ASSERT_TRUE(m.accept(t));
      if (t != stop) out += tok.token_bytes(t);
    }
    if (m.finished()) {
      ++completed;
      EXPECT_FALSE(nlohmann::json::parse(out, nullptr, false).is_discarded()) << out;
    }
  }
  EXPECT_GT(completed, 0);
}

}  // namespace
}  // namespace deltafin::grammar
