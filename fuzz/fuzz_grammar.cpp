// Fuzz bodies for constrained decoding: the GBNF parser and the JSON Schema compiler, each
// followed by the automaton's compilation and a few matcher steps on a small vocabulary (every
// byte, some multi-byte pieces and K3's markers as special tokens). Refusing an input is allowed
// (InvalidArgument); the invariant checked on whatever compiles is that the precomputed mask is
// exactly the set of tokens the direct simulation accepts.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_targets.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/pda.h"

namespace deltafin::fuzz {

namespace {

std::shared_ptr<const grammar::TokenVocab> small_vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* p : {"{\"", "\":", "\",", "\"}", " \"", "true", "null", "12", ", ", "\n ",
                          "\xC3\xA9", "\xE2\x82", "ab", "\"]", "[{", "}]", "--", "a\"", "é,"}) {
      bytes.emplace_back(p);
    }
    std::vector<bool> special(bytes.size(), false);
    for (const char* s : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}) {
      bytes.emplace_back(s);
      special.push_back(true);
    }
    return std::make_shared<const grammar::TokenVocab>(std::move(bytes), std::move(special));
  }();
  return v;
}

grammar::Limits fuzz_limits() {
  grammar::Limits l;
  l.max_nfa_states = 20'000;
  l.max_nodes = 4'000;
  l.max_compile_seconds = 5;
  return l;
}

// A few steps through the grammar, checking the mask against the direct check each time; the
// steps are chosen by `seed` bytes.
void walk(const grammar::Grammar& g, const uint8_t* seed, size_t n) {
  const auto v = small_vocab();
  auto cg =
      std::make_shared<const grammar::CompiledGrammar>(grammar::Pda::compile(g, fuzz_limits()), v);
  grammar::Matcher m(cg, {v->size() - 1});
  grammar::TokenMask mask;
  for (size_t step = 0; step < 6; ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> ok;
    for (int32_t t = 0; t < v->size(); ++t) {
      fuzz_check(mask.test(t) == m.allows(t), "the mask disagrees with the direct check");
      if (mask.test(t)) ok.push_back(t);
    }
    if (ok.empty() || m.finished()) break;
    const size_t pick = n > 0 ? seed[step % n] : step;
    fuzz_check(m.accept(ok[pick % ok.size()]), "a token of the mask was refused");
  }
}

}  // namespace

void gbnf(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const grammar::Grammar g = grammar::parse_gbnf(text, &small_vocab()->lookup());
    walk(g, data, size);
  } catch (const InvalidArgument&) {
  }
}

void json_schema(const uint8_t* data, size_t size) {
  const auto schema = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
  if (schema.is_discarded()) return;
  try {
    const grammar::Grammar g = grammar::json_schema_grammar(schema, "schema");
    walk(g, data, size);
  } catch (const InvalidArgument&) {
  }
}

}  // namespace deltafin::fuzz
