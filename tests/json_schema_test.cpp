// The JSON Schema compiler (src/grammar/json_schema.*): documents that satisfy a schema are
// accepted token by token on the 100k-token test tokenizer (as the real tokenizer encodes
// them), documents that violate it are refused at some token, and every unsupported keyword,
// bad reference and unsatisfiable schema is an error naming the keyword and its path, and the
// work of a compile (merges included) is counted against the compile budget. Samples
// drawn under these grammars are validated by an independent validator (ajv) in the end-to-end
// tests (structured_output_test.cpp).
#include "grammar/json_schema.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/budget.h"
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

// An object of 20 string properties in $defs, and an allOf of `n` references to it.
json many_refs(int n) {
  json props = json::object();
  for (int i = 0; i < 20; ++i) props[fmt::format("p{}", i)] = {{"type", "string"}};
  json all = json::array();
  for (int i = 0; i < n; ++i) all.push_back({{"$ref", "#/$defs/o"}});
  return {{"$defs", {{"o", {{"type", "object"}, {"properties", props}}}}}, {"allOf", all}};
}

// An allOf of thousands of references to one object took minutes (each merge
// copied the nesting the previous ones had built for every property) before a misleading
// "nested too deeply". Now a property that many merged schemas constrain is one flat allOf, so
// 60 references compile (they were "nested too deeply"), and the merges are counted: past
// kMaxSchemaMerges the schema is refused at once, naming the limit and where it was reached.
TEST(JsonSchema, AllOfMergesStayFlatAndAreCapped) {
  const auto v = TokenVocab::of(tok());
  EXPECT_NO_THROW(compile_json_schema(many_refs(60), v, false, "response_format"));
  EXPECT_TRUE(accepts(many_refs(60).dump(), R"({"p0": "a", "p19": "b"})"));
  EXPECT_FALSE(accepts(many_refs(60).dump(), R"({"p0": 1})"));
  try {
    compile_json_schema(many_refs(4900), v, false, "response_format");
    ADD_FAILURE() << "compiled";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("response_format: the schema is too large: allOf and $ref merge more "
                        "than 5000 subschemas into others"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("at #/allOf/"), std::string::npos) << what;
  }
}

// The work of a compile is counted in steps, merges included, and capped: the cap
// is what a test (and an attacker) can observe, not a clock. A 60-byte pattern whose automaton
// explodes was refused only by the 10 s clock; now by the step cap, deterministically.
TEST(JsonSchema, CompileWorkIsCountedInStepsAndCapped) {
  const auto v = TokenVocab::of(tok());
  const json hostile = {{"type", "string"}, {"pattern", "([^a][^b][^c][^d][^e]){200}"}};
  try {
    compile_json_schema(hostile, v, false, "response_format");
    ADD_FAILURE() << "compiled";
  } catch (const BudgetExceeded& e) {
    EXPECT_NE(std::string(e.what()).find(
                  fmt::format("compiling needs more than {} steps of work", kMaxCompileSteps)),
              std::string::npos)
        << e.what();
  }

  // Merging two enums compares every value of one with every value of the other: counted.
  json a = json::array(), b = json::array();
  for (int i = 0; i < 1000; ++i) {
    a.push_back(i);
    b.push_back(999 - i);
  }
  const json enums = {{"allOf", {{{"enum", a}}, {{"enum", b}}}}};
  {
    CompileBudget budget;
    json_schema_grammar(enums, "json_schema");
    EXPECT_GE(budget.used(), 1000u * 1000u);
  }
  // A smaller cap refuses the same schema in the merge, naming the field and where.
  BudgetOptions small;
  small.max_steps = 100'000;
  CompileBudget budget(small);
  try {
    json_schema_grammar(enums, "json_schema");
    ADD_FAILURE() << "compiled";
  } catch (const BudgetExceeded& e) {
    EXPECT_NE(
        std::string(e.what()).find("json_schema: compiling needs more than 100000 steps of work"),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("at #/allOf/1"), std::string::npos) << e.what();
  }
}

// A compile asks its budget's `cancelled` every kCheckEverySteps and stops when it
// says so (the server passes its ConnectionProbe: the client left).
TEST(JsonSchema, CompileStopsWhenItsCallerCancels) {
  const auto v = TokenVocab::of(tok());
  const json schema = {{"type", "string"}, {"pattern", "([^a][^b]){40}"}};
  int asked = 0;
  BudgetOptions o;
  o.cancelled = [&] { return ++asked > 1; };
  CompileBudget budget(o);
  EXPECT_THROW(compile_json_schema(schema, v, false, "json_schema"), CompileCancelled);
  EXPECT_EQ(asked, 2);
  EXPECT_LT(budget.used(), kMaxCompileSteps);
}

// How deep intersections nest in `e` (each subexpression once).
int intersection_depth(const Expr* e, std::map<const Expr*, int>& memo) {
  if (const auto it = memo.find(e); it != memo.end()) return it->second;
  int d = 0;
  for (const auto& x : e->items) d = std::max(d, intersection_depth(x.get(), memo));
  if (e->kind == ExprKind::intersect) ++d;
  return memo[e] = d;
}

// An allOf may gather thousands of patterns onto one string. They were intersected in a chain
// as deep as their number, and the automaton's compile checked every link's operand again (the
// square of their number, uncounted: 4,000 patterns burned 20 s of CPU without ever reaching a
// budget check). Now they form a balanced tree (as deep as the logarithm of their number), each
// operand is checked once, and what the check visits is charged: the hostile allOf is refused
// by a cap.
TEST(JsonSchema, ManyPatternsIntersectInABalancedTreeUnderTheBudget) {
  json all = json::array();
  for (int i = 0; i < 1000; ++i) all.push_back({{"pattern", "^[a-z]{0,8}$"}});
  const json schema = {{"type", "string"}, {"allOf", all}};
  const Grammar g = json_schema_grammar(schema, "json_schema");
  std::map<const Expr*, int> memo;
  int depth = 0;
  for (const auto& r : g.rules) {
    if (r) depth = std::max(depth, intersection_depth(r.get(), memo));
  }
  EXPECT_GE(depth, 10);  // 1,000 operands: at least log2(1000)
  EXPECT_LE(depth, 11);
  EXPECT_TRUE(accepts(schema.dump(), R"("abc")"));
  EXPECT_FALSE(accepts(schema.dump(), R"("abcdefghi")"));

  json hostile = json::array();
  for (int i = 0; i < 4000; ++i) hostile.push_back({{"pattern", fmt::format("x{}", i)}});
  try {
    compile_json_schema({{"type", "string"}, {"allOf", hostile}}, TokenVocab::of(tok()), false,
                        "response_format");
    ADD_FAILURE() << "compiled";
  } catch (const InvalidArgument& e) {
    // The step cap or, first, the cap on an intersection's states.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("steps of work") != std::string::npos ||
                what.find("an intersection is too large") != std::string::npos)
        << what;
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
