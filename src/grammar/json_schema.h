// JSON Schema to grammar IR (docs/STRUCTURED-OUTPUT.md has the coverage table).
//
// Every keyword either shapes the grammar or is an annotation; anything else is an
// InvalidArgument that names the keyword and its JSON Pointer (`uniqueItems at /properties/
// tags`), never silently unconstrained. Decisions where JSON Schema leaves room:
//  * objects list their properties in the schema's order, required or optional; other keys
//    only where `additionalProperties` allows them (absent = not allowed when `properties` is
//    given, llama.cpp's default; an object schema without `properties` is any object), with
//    plain key text (no escapes), so they can be told apart from the declared keys;
//  * `oneOf` is compiled as `anyOf` (its branches are not made exclusive);
//  * `allOf` is merged into one schema where the keywords combine (intersections of types,
//    ranges, patterns; unions of required and properties), an error otherwise; a property (or
//    `items`, `additionalProperties`) that several merged schemas constrain becomes one flat
//    `allOf` of their subschemas;
//  * `enum` / `const` values are produced as given (compact JSON) and take precedence over the
//    other keywords except `type`, which filters them;
//  * whitespace between tokens is `""`, `" "` or a newline and up to 20 spaces or tabs (bounded,
//    so a model cannot pad forever); numbers have at most 16 digits before and after the point.
//
// Bounds: besides the counts below, everything the compiler does — subschemas compiled, JSON
// values copied and compared while merging `allOf` and `$ref` — is charged to the compile budget
// (budget.h), which the automaton's compile then shares: a schema that asks for too much work is
// refused at a fixed number of steps, naming the path where the budget ran out.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/budget.h"
#include "grammar/ir.h"

namespace deltafin::grammar {

inline constexpr size_t kMaxSchemaNodes = 5000;    // subschemas compiled per schema
inline constexpr size_t kMaxSchemaMerges = 5000;   // subschemas allOf / $ref merge into others
inline constexpr int kMaxSchemaDepth = 48;         // nesting of subschemas (refs excluded)
inline constexpr size_t kMaxSchemaEnum = 1024;     // enum values
inline constexpr uint32_t kMaxSchemaCount = 2000;  // minLength, maxItems, ... bounds

class SchemaCompiler {
 public:
  // `g` receives the rules; `root` is the document $refs resolve against; `prefix` starts every
  // error message (the request field holding the schema). The work is charged to the compile
  // budget open on this thread, or to one of the compiler's own when none is (budget.h).
  // `strings` (optional) is where the rules of string constraints are kept by their keywords
  // (shared_string): several compilers writing into one grammar may share one.
  SchemaCompiler(Grammar& g, const nlohmann::ordered_json& root, std::string prefix,
                 std::map<std::string, uint32_t>* strings = nullptr);

  // JSON text of a value of `schema` (found at JSON Pointer `path`), followed by optional
  // whitespace.
  ExprPtr value(const nlohmann::ordered_json& schema, const std::string& path);
  // The same, restricted to one JSON type ("string", "number", "boolean", "null", "object",
  // "array"; "number" includes integers): `nothing()` when the schema allows none of it.
  ExprPtr value_of_type(const nlohmann::ordered_json& schema, const std::string& path,
                        const std::string& type);
  // The decoded text of the strings `schema` allows (no quotes, no escapes): K3 writes string
  // arguments raw. `nothing()` when it allows no string.
  ExprPtr raw_string(const nlohmann::ordered_json& schema, const std::string& path);

  // An object schema seen as its members (after $ref and allOf), for K3's argument tags.
  struct Member {
    std::string key;
    nlohmann::ordered_json schema;
    std::string path;
    bool required = false;
  };
  struct ObjectShape {
    std::vector<Member> members;
    bool additional = false;  // other keys allowed
    nlohmann::ordered_json additional_schema = true;
  };
  // Throws when `schema` does not describe objects.
  ObjectShape object_shape(const nlohmann::ordered_json& schema, const std::string& path);

  ExprPtr ws();

  // Strings over `alphabet` that are none of `keys` (how extra keys stay apart from the
  // declared ones).
  static ExprPtr not_keys(const std::vector<std::string>& keys,
                          const std::vector<CharRange>& alphabet);

 private:
  [[noreturn]] void error(const std::string& path, const std::string& what) const;
  // Charges `steps` to the compile budget; its error names `path`.
  void spend(uint64_t steps, const std::string& path);
  // The alternatives of the values of `s`'s `const` (else `enum`) that `make` turns into an
  // expression (null: left out), each value charged to the budget.
  ExprPtr enum_alternatives(const nlohmann::ordered_json& s, const std::string& path,
                            const std::function<ExprPtr(const nlohmann::ordered_json&)>& make);
  // Follows a top-level $ref (with its sibling keywords merged in) and merges allOf, so the
  // result has neither at its top; `path` becomes where the result came from. Returns `schema`
  // itself when there is nothing to merge, else the merged schema, built in `storage`.
  const nlohmann::ordered_json& flatten(const nlohmann::ordered_json& schema, std::string& path,
                                        nlohmann::ordered_json& storage);
  const nlohmann::ordered_json& target(const std::string& ref, const std::string& path);
  // Merges `sub` into `acc` (allOf semantics); with `skip_refs`, leaving out sub's $ref and
  // allOf (flatten merges those itself).
  void merge_into(nlohmann::ordered_json& acc, const nlohmann::ordered_json& sub,
                  const std::string& path, bool skip_refs = false);
  // acc[key] and `v` both constrain the same place: acc[key] becomes their allOf (one flat list).
  void conjoin(nlohmann::ordered_json& a, const nlohmann::ordered_json& v, const std::string& path);
  void check_keywords(const nlohmann::ordered_json& schema, const std::string& path);
  // anyOf / oneOf: `f` of each branch (with the keywords beside them merged in), or null.
  ExprPtr branches(
      const nlohmann::ordered_json& s, const std::string& path,
      const std::function<ExprPtr(const nlohmann::ordered_json&, const std::string&)>& f);
  std::vector<std::string> types_of(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr typed(const nlohmann::ordered_json& schema, const std::string& path,
                const std::string& type);
  ExprPtr string_content(const nlohmann::ordered_json& schema, const std::string& path);
  // The rule for the strings `s`'s length, pattern and format allow (`kind`: "json-string", the
  // quoted JSON text, or "raw-string"), `body` compiled once per distinct set of those keywords:
  // a schema often repeats a format or pattern, and each copy would be compiled again.
  ExprPtr shared_string(const char* kind, const nlohmann::ordered_json& s, const std::string& path,
                        const std::function<ExprPtr()>& body);
  uint32_t count_of(const nlohmann::ordered_json& s, const std::string& path, const char* key,
                    uint32_t def);
  ExprPtr object_value(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr array_value(const nlohmann::ordered_json& schema, const std::string& path);
  ExprPtr any_value();
  ExprPtr literal(const nlohmann::ordered_json& v);
  ExprPtr rule_for(const std::string& name, const std::function<ExprPtr()>& body);
  void count(const std::string& path);

  BudgetScope budget_;
  Grammar& g_;
  const nlohmann::ordered_json& root_;
  std::string prefix_;
  std::map<std::string, uint32_t> ref_rules_;
  std::map<std::string, uint32_t> named_;
  std::map<std::string, uint32_t> own_strings_;
  std::map<std::string, uint32_t>& strings_;  // shared_string's rules by their keywords
  size_t nodes_ = 0;
  size_t merges_ = 0;
  int depth_ = 0;
};

// A grammar whose root is one JSON value of `schema` (no leading whitespace). `path_prefix`
// starts every error message (the request field, e.g. "response_format.json_schema.schema").
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const std::string& path_prefix);

// Any JSON object (`response_format: json_object`).
Grammar json_object_grammar();

}  // namespace deltafin::grammar
