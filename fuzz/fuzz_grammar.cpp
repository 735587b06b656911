// Fuzz bodies for constrained decoding: the GBNF parser and the JSON Schema compiler, each
// followed by the automaton's compilation and a few matcher steps on a small vocabulary (every
// byte, some multi-byte pieces and K3's markers as special tokens). Refusing an input is allowed
// (InvalidArgument); the invariant checked on whatever compiles is that the precomputed mask is
// exactly the set of tokens the direct simulation accepts.
//
// schema_merge reaches what random JSON text almost never does: the merges of allOf and $ref.
// Its input is not JSON but a program: each byte picks the next choice of a small generator
// that writes a schema with four $defs (which may refer to each other, in cycles too), allOf
// lists of references and inline schemas, $ref with sibling keywords, and every keyword the
// merge combines (type, enum / const, properties / required, items in both forms,
// additionalProperties, bounds, pattern, format, nullable). Its checks: the compile (under a
// compile budget, budget.h) ends in a grammar or an InvalidArgument; the same schema compiles
// to the same grammar twice; and the masks agree, as above.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_targets.h"
#include "grammar/budget.h"
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
  return l;
}

// The budget of one input's compile: the default steps, and a clock of 5 s behind them.
grammar::BudgetOptions fuzz_budget() {
  grammar::BudgetOptions o;
  o.max_seconds = 5;
  return o;
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
  const grammar::CompileBudget budget(fuzz_budget());
  try {
    const grammar::Grammar g = grammar::parse_gbnf(text, &small_vocab()->lookup());
    walk(g, data, size);
  } catch (const InvalidArgument&) {
  }
}

void json_schema(const uint8_t* data, size_t size) {
  const auto schema = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
  if (schema.is_discarded()) return;
  const grammar::CompileBudget budget(fuzz_budget());
  try {
    const grammar::Grammar g = grammar::json_schema_grammar(schema, "schema");
    walk(g, data, size);
  } catch (const InvalidArgument&) {
  }
}

namespace {

using json = nlohmann::ordered_json;

// The schema_merge generator: each call of next() takes one input byte (0 once they run out,
// which always picks the simplest choice, so every input ends in a finite schema).
class SchemaWriter {
 public:
  // The bytes at `offset`, `offset` + 2, ...: the root schema reads the even bytes and the $defs
  // the odd ones, so that a short input shapes both.
  SchemaWriter(const uint8_t* data, size_t size, size_t offset) {
    for (size_t i = offset; i < size; i += 2) bytes_.push_back(data[i]);
  }

  static json document(const uint8_t* data, size_t size) {
    json root = SchemaWriter(data, size, 0).schema(0);
    if (!root.is_object()) root = json{{"allOf", json::array({root})}};
    SchemaWriter defs_writer(data, size, 1);
    json defs = json::object();
    for (const char* name : {"A", "B", "C", "D"}) defs[name] = defs_writer.schema(1);
    root["$defs"] = std::move(defs);
    return root;
  }

 private:
  uint8_t next() { return pos_ < bytes_.size() ? bytes_[pos_++] : 0; }
  size_t pick(size_t n) { return next() % n; }

  json ref() { return fmt::format("#/$defs/{}", "ABCD"[pick(4)]); }

  json small_value() {
    switch (pick(6)) {
      case 0:
        return pick(2) == 0;
      case 1:
        return nullptr;
      case 2:
        return static_cast<int>(pick(5)) - 1;
      case 3:
        return std::string(1, "xyz"[pick(3)]);
      case 4:
        return 0.5 * static_cast<double>(pick(7));
      default:
        return json::array({static_cast<int>(pick(3))});
    }
  }

  // A schema `depth` levels down: a boolean, or an object of one to three keyword groups.
  json schema(int depth) {
    const uint8_t b = next();
    if (b == 0 || depth > 3) return depth > 3 ? json{{"type", "integer"}} : json(true);
    if (b == 255) return false;
    json s = json::object();
    const size_t groups = 1 + b % 3;
    for (size_t i = 0; i < groups; ++i) keywords(s, depth);
    return s;
  }

  void keywords(json& s, int depth) {
    static const char* const kTypes[] = {"string", "number", "integer", "boolean",
                                         "null",   "object", "array"};
    static const char* const kPatterns[] = {"^a+$", "b", "^[a-c]{1,3}$", "x|y", "^\\d{2}$", ""};
    static const char* const kFormats[] = {"date", "uuid", "email"};
    switch (pick(12)) {
      case 0:
        if (pick(2) == 0) {
          s["type"] = kTypes[pick(7)];
        } else {
          s["type"] = json::array({kTypes[pick(7)], kTypes[pick(7)]});
        }
        break;
      case 1:
        s["$ref"] = ref();
        break;
      case 2: {
        json all = json::array();
        for (size_t i = 0, n = 1 + pick(4); i < n; ++i)
          all.push_back(pick(2) == 0 ? json{{"$ref", ref()}} : schema(depth + 1));
        s["allOf"] = std::move(all);
        break;
      }
      case 3: {
        json props = json::object();
        for (size_t i = 0, n = pick(4); i < n; ++i)
          props[std::string(1, "abcd"[pick(4)])] = schema(depth + 1);
        s["properties"] = std::move(props);
        if (pick(2) == 0) s["required"] = json::array({std::string(1, "abcd"[pick(4)])});
        if (pick(3) == 0)
          s["additionalProperties"] = pick(2) == 0 ? json(false) : schema(depth + 1);
        break;
      }
      case 4:
        if (pick(3) == 0) {
          s["items"] = json::array({schema(depth + 1), schema(depth + 1)});
          if (pick(2) == 0) s["additionalItems"] = pick(2) == 0;
        } else {
          s["items"] = schema(depth + 1);
        }
        if (pick(2) == 0) s["minItems"] = pick(3);
        if (pick(2) == 0) s["maxItems"] = 1 + pick(4);
        break;
      case 5:
        if (pick(2) == 0) s["minLength"] = pick(3);
        if (pick(2) == 0) s["maxLength"] = 1 + pick(5);
        if (pick(2) == 0) s["pattern"] = kPatterns[pick(6)];
        if (pick(4) == 0) s["format"] = kFormats[pick(3)];
        break;
      case 6: {
        const char* lo = pick(2) == 0 ? "minimum" : "exclusiveMinimum";
        const char* hi = pick(2) == 0 ? "maximum" : "exclusiveMaximum";
        if (pick(2) == 0) s[lo] = static_cast<int>(pick(10)) - 5;
        if (pick(2) == 0) s[hi] = 0.25 * static_cast<double>(pick(40));
        break;
      }
      case 7: {
        json values = json::array();
        for (size_t i = 0, n = 1 + pick(4); i < n; ++i) values.push_back(small_value());
        s["enum"] = std::move(values);
        break;
      }
      case 8:
        s["const"] = small_value();
        break;
      case 9: {
        json alts = json::array();
        for (size_t i = 0, n = 1 + pick(3); i < n; ++i) alts.push_back(schema(depth + 1));
        s[pick(2) == 0 ? "anyOf" : "oneOf"] = std::move(alts);
        break;
      }
      case 10:
        s["nullable"] = pick(2) == 0;
        break;
      default:  // an annotation beside the rest (merges skip it)
        s["description"] = "d";
        break;
    }
  }

  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
};

// The schema's grammar, or nothing when the compiler refuses it.
std::optional<std::string> schema_gbnf(const json& schema) {
  try {
    return grammar::to_gbnf(grammar::json_schema_grammar(schema, "schema"));
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

}  // namespace

void schema_merge(const uint8_t* data, size_t size) {
  const json schema = SchemaWriter::document(data, size);
  const grammar::CompileBudget budget(fuzz_budget());
  const auto first = schema_gbnf(schema);
  if (!first) return;
  fuzz_check(schema_gbnf(schema) == first, "the same schema compiled to two grammars");
  try {
    walk(grammar::json_schema_grammar(schema, "schema"), data, size);
  } catch (const InvalidArgument&) {
  }
}

}  // namespace deltafin::fuzz
