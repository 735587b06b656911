// The JSON Schema compiler (src/grammar/json_schema.*): documents that satisfy a schema are
// accepted token by token on the 100k-token test tokenizer (as the real tokenizer encodes
// them), documents that violate it are refused at some token, and every unsupported keyword,
// bad reference and unsatisfiable schema is an error naming the keyword and its path. Samples
// drawn under these grammars are validated by an independent validator (ajv) in the end-to-end
// tests (structured_output_test.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/constraint.h"
#include "grammar/matcher.h"
#include "server_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::grammar {
namespace {

using json = nlohmann::ordered_json;

const Tokenizer& tok() {
  return test::k3_tokenizer();
}

// Whether `doc` is accepted token by token and the grammar may end after it.
bool accepts(const std::string& schema, const std::string& doc) {
  const auto g = compile_json_schema(json::parse(schema), TokenVocab::of(tok()));
  Matcher m(g, {tok().vocab_size() - 1});
  TokenMask mask;
  for (const int32_t t : tok().encode_ordinary(doc)) {
    m.fill_mask(mask);
    const bool allowed = mask.test(t);
    EXPECT_EQ(allowed, m.allows(t)) << "mask and direct check disagree";
    if (!allowed) return false;
    if (!m.accept(t)) return false;
  }
  return m.complete();
}

struct Case {
  std::string schema;
  std::vector<std::string> good, bad;
};

TEST(JsonSchema, AcceptsWhatSatisfiesAndRefusesWhatViolates) {
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":12}},"required":["a"]})",
       {R"({"a": 0})", R"({"a": -5})", R"({"a":12})", "{\n  \"a\": 7\n}"},
       {R"({"a": 13})", R"({"a": -6})", R"({"a": 1.5})", "{}", R"({"a": 1, "b": 2})",
        R"({"a": 012})"}},
      {R"({"type":"number","exclusiveMinimum":0.5,"maximum":2.25})",
       {"0.51", "1", "2.25", "2.2", "0.6", "2.250", "1.999"},
       {"0.5", "0.50", "2.26", "3", "-1", "0.4999", "2.2500001"}},
      {R"({"type":"number","minimum":-2.5,"maximum":-0.5})",
       {"-2.5", "-1", "-0.5", "-0.75", "-2.49"},
       {"0", "-0.4", "-2.6", "-3", "1"}},
      {R"({"type":"integer","minimum":1.5,"exclusiveMaximum":4})", {"2", "3"}, {"1", "4", "2.5"}},
      {R"({"type":"integer","exclusiveMinimum":-10,"maximum":100})",
       {"-9", "0", "100", "55"},
       {"-10", "101", "-11", "1000"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")"},
       {R"("AB-12")", R"("ab-123")", R"("AB-1234")"}},
      {R"({"type":"string","pattern":"abc"})",
       {R"("xxabcyy")", R"("abc")"},
       {R"("ab")", R"("acb")"}},
      {R"({"type":"string","pattern":"^a\"b\\\\c$"})",
       {R"("a\"b\\c")"},
       {R"("ab\\c")", R"("a\"bc")"}},
      {R"({"type":"string","format":"date"})",
       {R"("2024-02-29")", R"("2023-12-31")", R"("2000-02-29")", R"("0004-02-29")"},
       {R"("2023-02-29")", R"("2024-13-01")", R"("2024-04-31")", R"("1900-02-29")",
        R"("0000-01-01")"}},
      {R"({"type":"string","format":"date-time"})",
       {R"("2024-05-01T13:45:00Z")", R"("1999-12-31T23:59:59.123+05:30")"},
       {R"("2024-05-01 13:45:00")", R"("2024-05-01T24:00:00Z")", R"("2024-05-01T13:45:00")"}},
      {R"({"type":"string","format":"uuid"})",
       {R"("0f8fad5b-d9cb-469f-a165-70867728950e")"},
       {R"("0f8fad5b-d9cb-469f-a165-70867728950")", R"("0f8fad5bd9cb469fa16570867728950e")"}},
      {R"({"type":"string","format":"email"})",
       {R"("ada.lovelace@example.org")", R"("x+y@a-b.co")"},
       {R"("ada@")", R"("@example.org")", R"("a b@example.org")", R"("ada@example")"}},
      {R"({"type":"string","format":"ipv4"})",
       {R"("192.168.0.1")", R"("8.8.8.8")"},
       {R"("256.1.1.1")", R"("1.2.3")"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {"\"\xC3\xA9\xC3\xBC\"", R"("abc")", R"("a\"b")", R"("\u00e9x")"},
       {R"("a")", R"("abcd")", R"("")"}},
      {R"({"enum":["Zürich","東京",1,null,{"k":[true]}]})",
       {R"("Zürich")", R"("東京")", "1", "null", R"({"k":[true]})"},
       {R"("Zurich")", "2", "true"}},
      {R"({"const":"only"})", {R"("only")"}, {R"("Only")"}},
      {R"({"anyOf":[{"type":"string","maxLength":3},{"type":"integer"}]})",
       {R"("abc")", "42"},
       {R"("abcd")", "4.5", "null"}},
      {R"({"type":["string","null"]})", {R"("x")", "null"}, {"1"}},
      {R"({"type":"string","nullable":true,"maxLength":1})", {R"("x")", "null"}, {R"("xy")"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                    {"properties":{"b":{"type":"integer","minimum":0}},"required":["b"]}]})",
       {R"({"a": "x", "b": 1})"},
       {R"({"a": "x"})", R"({"a": "x", "b": -1})"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
            "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
          "$ref":"#/$defs/node"})",
       {R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"},
       {R"({"v": 1, "kids": [{"w": 2}]})"}},
      {R"({"properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
       {R"({"a": 1, "zz": "q"})", R"({"a": 1})", R"({"b": "x", "c": "y"})", R"({})"},
       {R"({"a": 1, "zz": 2})", R"({"a": 1, "a": "x"})"}},
      {R"({"type":"object","properties":{"x":{"type":"boolean"},"y":{"type":"boolean"},"z":{"type":"boolean"}}})",
       {"{}", R"({"y": true})", R"({"x": true, "z": false})",
        R"({"x": true, "y": true, "z": true})"},
       {R"({"z": true, "x": true})", R"({"w": true})"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":{"type":"boolean"},"minItems":2,"maxItems":4})",
       {R"([1, "a"])", R"([1,"a",true,false])"},
       {"[1]", R"([1,"a",true,false,true])", R"(["a",1])", "[]"}},
      {R"({"type":"array","items":[{"type":"null"}],"additionalItems":false})",
       {"[null]", "[]"},
       {"[null, null]"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
       {"[1]", "[1, 2, 3]"},
       {"[]", "[1, 2, 3, 4]"}},
      {"{}", {R"({"any": [1, "two", null, {"x": {}}]})", "3.5e7", R"("s")"}, {"{", "tru"}},
      {"true", {"[]"}, {"]"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    for (const auto& d : c.good) EXPECT_TRUE(accepts(c.schema, d)) << "refused: " << d;
    for (const auto& d : c.bad) EXPECT_FALSE(accepts(c.schema, d)) << "accepted: " << d;
  }
}

TEST(JsonSchema, UnsupportedAndUnsatisfiableSchemasNameKeywordAndPath) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type":"array","uniqueItems":true})",
       "unsupported keyword \"uniqueItems\" (only false) at #"},
      {R"({"properties":{"a":{"not":{}}}})", "unsupported keyword \"not\" at #/properties/a"},
      {R"({"type":"object","patternProperties":{"^x":{}}})",
       "unsupported keyword \"patternProperties\" at #"},
      {R"({"items":{"contains":{}}})", "unsupported keyword \"contains\" at #/items"},
      {R"({"if":{},"then":{}})", "unsupported keyword \"if\" at #"},
      {R"({"type":"number","multipleOf":2})", "unsupported keyword \"multipleOf\" at #"},
      {R"({"$ref":"http://example.com/s.json"})", "only local references"},
      {R"({"$ref":"#/$defs/missing"})", "$ref \"#/$defs/missing\" does not resolve at #"},
      {R"({"type":"string","pattern":"(?=a)b"})", "lookaround"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreferences are not supported"},
      {R"({"type":"string","pattern":"\\p{L}"})", "Unicode property escapes"},
      {R"({"type":"string","format":"color"})", "format \"color\" is not supported"},
      {R"({"type":"string","minLength":3,"maxLength":2})",
       "minLength is above maxLength (unsatisfiable) at #"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "the range is empty"},
      {R"({"enum":[]})", "no enum value"},
      {R"({"type":"object","required":["x"],"properties":{},"additionalProperties":false})",
       "required property \"x\" is not allowed"},
      {R"({"type":"strung"})", "unknown type \"strung\" at #"},
      {R"({"type":"string","maxLength":5000})", "maxLength 5000 is above the supported 2000"},
      {R"({"type":"number","minimum":1e20})", "more digits than supported"},
      {R"({"allOf":[{"type":"string"},{"type":"integer"}]})", "the types have nothing in common"},
      {R"({"properties":{"a":{"anyOf":[{"type":"string"}],"oneOf":[{"type":"string"}]}}})",
       "anyOf together with oneOf is not supported at #/properties/a"},
      {"false", "can never be completed"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "reference cycle"},
  };
  for (const auto& [schema, msg] : bad) {
    try {
      compile_json_schema(json::parse(schema), TokenVocab::of(tok()), false, "response_format");
      ADD_FAILURE() << "compiled: " << schema;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos)
          << schema << " gave: " << e.what();
    }
  }
}

TEST(JsonSchema, CompiledGrammarsAreCachedByTheirText) {
  const auto v = TokenVocab::of(tok());
  const json s = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}}})");
  const auto a = compile_json_schema(s, v), b = compile_json_schema(s, v);
  EXPECT_EQ(a.get(), b.get());
  const auto c = compile_json_schema(
      json::parse(R"({"type":"object","properties":{"m":{"type":"integer"}}})"), v);
  EXPECT_NE(a.get(), c.get());
}

}  // namespace
}  // namespace deltafin::grammar
