// JSON Schema to grammar IR (see json_schema.h). The merges of allOf and $ref copy and compare
// JSON values whose sizes the client chooses, so each one charges what it copies or compares to
// the compile budget (weight()), and a property that many merged schemas constrain grows one
// flat allOf instead of a nesting that every later merge would copy again.
#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "grammar/numbers.h"
#include "grammar/regex.h"
#include "grammar/strings.h"
#include "tokenizer/utf8.h"

namespace deltafin::grammar {

using json = nlohmann::ordered_json;

namespace {

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"$schema",         "$id",
                                          "$comment",        "$defs",
                                          "definitions",     "title",
                                          "description",     "default",
                                          "examples",        "deprecated",
                                          "readOnly",        "writeOnly",
                                          "$anchor_unused",  "contentMediaType",
                                          "contentEncoding", "strict"};
  return s;
}

const std::set<std::string>& constraints() {
  static const std::set<std::string> s = {"type",
                                          "enum",
                                          "const",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "nullable",
                                          "uniqueItems"};
  return s;
}

const char* const kTypes[] = {"string", "number", "integer", "boolean", "null", "object", "array"};

// Whether `s` constrains anything (keywords other than annotations), `except` aside.
bool has_constraints(const json& s, std::string_view except = {}) {
  if (!s.is_object()) return !s.is_boolean() || !s.get<bool>();
  for (const auto& [k, v] : s.items()) {
    if (k != except && !annotations().contains(k)) return true;
  }
  return false;
}

// What the merges' work costs in budget steps, measured against the automaton's (where a step is
// a few nanoseconds): a JSON value copied is an allocation, a key or value compared a string
// comparison; each is charged kValueSteps.
constexpr uint64_t kValueSteps = 4;

// The steps of copying, comparing or printing `v`: kValueSteps per JSON value in it. Without
// recursion (the value may be nested as deep as its parser allowed).
uint64_t weight(const json& v) {
  uint64_t n = 0;
  std::vector<const json*> todo{&v};
  while (!todo.empty()) {
    const json* x = todo.back();
    todo.pop_back();
    ++n;
    if (x->is_structured()) {
      for (const auto& c : *x) todo.push_back(&c);
    }
  }
  return kValueSteps * n;
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string rule_name(std::string_view hint) {
  std::string out;
  for (const char c : hint) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
    if (out.size() >= 40) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "schema" : out;
}

bool json_type_is(const json& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return d == static_cast<double>(static_cast<int64_t>(d));
    }
    return false;
  }
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

std::vector<std::string> string_list(const json& v) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const auto& x : v) {
      if (x.is_string()) out.push_back(x.get<std::string>());
    }
  }
  return out;
}

}  // namespace

SchemaCompiler::SchemaCompiler(Grammar& g, const json& root, std::string prefix,
                               std::map<std::string, uint32_t>* strings)
    : g_(g),
      root_(root),
      prefix_(std::move(prefix)),
      strings_(strings != nullptr ? *strings : own_strings_) {}

void SchemaCompiler::error(const std::string& path, const std::string& what) const {
  fail_arg("{}: {} at {}", prefix_, what, path);
}

void SchemaCompiler::spend(uint64_t steps, const std::string& path) {
  try {
    budget_.budget().spend(steps);
  } catch (const BudgetExceeded& e) {
    throw BudgetExceeded(fmt::format("{}: {} at {}", prefix_, e.what(), path));
  }
}

void SchemaCompiler::count(const std::string& path) {
  spend(1, path);
  if (++nodes_ > kMaxSchemaNodes)
    error(path, fmt::format("the schema is too large (more than {} subschemas)", kMaxSchemaNodes));
}

ExprPtr SchemaCompiler::ws() {
  return alt(
      {empty(), lit(" "), seq({lit("\n"), repeat(chars({{' ', ' '}, {'\t', '\t'}}), 0, 20)})});
}

ExprPtr SchemaCompiler::rule_for(const std::string& name, const std::function<ExprPtr()>& body) {
  if (auto it = named_.find(name); it != named_.end()) return ref(it->second);
  const uint32_t id = g_.fresh_rule(name);
  named_[name] = id;
  g_.define(id, body());
  return ref(id);
}

ExprPtr SchemaCompiler::any_value() {
  return rule_for("value", [&] {
    const ExprPtr kv = seq({rule_for("string",
                                     [&] {
                                       return seq({lit("\""), star(json_char()), lit("\""), ws()});
                                     }),
                            lit(":"), ws(), rule_for("value", [] { return nothing(); })});
    // (the inner rule_for("value") finds this rule's id: recursion)
    const ExprPtr object = rule_for("object", [&] {
      return seq({lit("{"), ws(), opt(seq({kv, star(seq({lit(","), ws(), kv}))})), lit("}"), ws()});
    });
    const ExprPtr value = ref(named_.at("value"));
    const ExprPtr array = rule_for("array", [&] {
      return seq(
          {lit("["), ws(), opt(seq({value, star(seq({lit(","), ws(), value}))})), lit("]"), ws()});
    });
    const ExprPtr number = rule_for("number", [&] {
      return seq({number_text(std::nullopt, std::nullopt, false, ""), ws()});
    });
    return alt({object, array, ref(named_.at("string")), number,
                seq({alt({lit("true"), lit("false"), lit("null")}), ws()})});
  });
}

ExprPtr SchemaCompiler::literal(const json& v) {
  if (CompileBudget* b = CompileBudget::current()) b->spend(weight(v));
  return seq({lit(v.dump(-1, ' ', false, json::error_handler_t::replace)), ws()});
}

void SchemaCompiler::check_keywords(const json& s, const std::string& path) {
  spend(1 + s.size(), path);
  for (const auto& [k, v] : s.items()) {
    if (annotations().contains(k) || constraints().contains(k)) continue;
    if (k.rfind("x-", 0) == 0) continue;  // vendor extensions are annotations
    error(path, fmt::format("unsupported keyword \"{}\"", k));
  }
  if (const auto it = s.find("uniqueItems");
      it != s.end() && !(it->is_boolean() && !it->get<bool>()))
    error(path, "unsupported keyword \"uniqueItems\" (only false)");
}

const json& SchemaCompiler::target(const std::string& ref, const std::string& path) {
  if (ref.empty() || ref[0] != '#')
    error(path, fmt::format("$ref \"{}\" is not supported (only local references, #/...)", ref));
  const json* cur = &root_;
  size_t i = 1;
  while (i < ref.size()) {
    if (ref[i] != '/') error(path, fmt::format("$ref \"{}\" is not a JSON Pointer", ref));
    const size_t next = ref.find('/', i + 1);
    spend(1 + (cur->is_structured() ? cur->size() : 0), path);
    std::string part =
        ref.substr(i + 1, next == std::string::npos ? std::string::npos : next - i - 1);
    std::string key;
    for (size_t k = 0; k < part.size(); ++k) {
      if (part[k] == '~' && k + 1 < part.size() && (part[k + 1] == '0' || part[k + 1] == '1')) {
        key += part[k + 1] == '0' ? '~' : '/';
        ++k;
      } else {
        key += part[k];
      }
    }
    if (cur->is_object() && cur->contains(key)) {
      cur = &(*cur)[key];
    } else if (cur->is_array() && !key.empty() &&
               key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(key) < cur->size()) {
      cur = &(*cur)[std::stoul(key)];
    } else {
      error(path, fmt::format("$ref \"{}\" does not resolve", ref));
    }
    i = next == std::string::npos ? ref.size() : next;
  }
  return *cur;
}

const json& SchemaCompiler::flatten(const json& schema, std::string& path, json& storage) {
  if (!schema.is_object()) return schema;
  if (!schema.contains("$ref") && !schema.contains("allOf")) return schema;
  if (++depth_ > kMaxSchemaDepth)
    error(path, "$ref / allOf nested too deeply (a reference cycle?)");
  count(path);
  json acc = json::object();
  merge_into(acc, schema, path, true);
  if (schema.contains("$ref")) {
    const auto& r = schema["$ref"];
    if (!r.is_string()) error(path, "$ref must be a string");
    std::string at = r.get<std::string>();
    const json& t = target(at, path);
    if (t.is_object()) check_keywords(t, at);
    json sub;
    merge_into(acc, flatten(t, at, sub), at);
  }
  if (schema.contains("allOf")) {
    const auto& all = schema["allOf"];
    if (!all.is_array() || all.empty()) error(path, "allOf must be a non-empty array");
    for (size_t i = 0; i < all.size(); ++i) {
      std::string p = path + "/allOf/" + std::to_string(i);
      if (all[i].is_object()) check_keywords(all[i], p);
      json sub;
      merge_into(acc, flatten(all[i], p, sub), p);
    }
  }
  --depth_;
  storage = std::move(acc);
  return storage;
}

void SchemaCompiler::conjoin(json& a, const json& v, const std::string& path) {
  if (++merges_ > kMaxSchemaMerges)
    error(path, fmt::format("the schema is too large: allOf and $ref merge more than {} "
                            "subschemas into others (counting each property, items or "
                            "additionalProperties that two merged schemas both constrain)",
                            kMaxSchemaMerges));
  spend(1 + weight(v), path);
  // allOf [allOf [x, y], v] is allOf [x, y, v]: append rather than nest, so that n merges of the
  // same property cost n, not n^2 (each nesting would be copied by the next merge).
  if (a.is_object() && a.size() == 1 && a.contains("allOf") && a["allOf"].is_array() &&
      !a["allOf"].empty()) {
    a["allOf"].push_back(v);
    return;
  }
  json both = json::array();
  both.push_back(std::move(a));
  both.push_back(v);
  a = json::object();
  a["allOf"] = std::move(both);
}

void SchemaCompiler::merge_into(json& acc, const json& sub, const std::string& path,
                                bool skip_refs) {
  if (acc.is_boolean() && !acc.get<bool>()) return;
  if (sub.is_boolean()) {
    if (!sub.get<bool>()) acc = false;
    return;
  }
  if (!sub.is_object()) error(path, "a schema must be an object or a boolean");
  // Every key of `sub` is looked up in `acc` (an ordered object: a linear search).
  spend(1 + kValueSteps * sub.size() * (1 + acc.size()), path);
  auto as_list = [](const json& v) {
    json out = json::array();
    if (v.is_array()) {
      out = v;
    } else {
      out.push_back(v);
    }
    return out;
  };
  for (const auto& [k, v] : sub.items()) {
    if (skip_refs && (k == "$ref" || k == "allOf")) continue;
    if ((k == "enum" || k == "const") && (acc.contains("enum") || acc.contains("const"))) {
      // Both restrict the values (`const` is a one-value enum): keep the values in both lists.
      if (k == "enum" && !v.is_array()) error(path, "enum must be an array");
      const json* x = acc.contains("const") ? nullptr : &acc["enum"];
      if (x != nullptr && !x->is_array()) error(path, "enum must be an array");
      const json mine = x != nullptr ? *x : json::array({acc["const"]});
      const json theirs = k == "const" ? json::array({v}) : v;
      // Each value of one list is looked for in the other.
      spend(weight(mine) + weight(theirs) + kValueSteps * mine.size() * theirs.size(), path);
      json out = json::array();
      for (const auto& e : mine) {
        if (std::find(theirs.begin(), theirs.end(), e) != theirs.end()) out.push_back(e);
      }
      if (out.empty()) error(path, "allOf: the enum / const values have nothing in common");
      acc.erase("const");
      acc["enum"] = std::move(out);
      continue;
    }
    if (!acc.contains(k)) {
      spend(weight(v), path);
      acc[k] = v;
      continue;
    }
    if (annotations().contains(k) || k.rfind("x-", 0) == 0) continue;
    json& a = acc[k];
    if (k == "type") {
      std::vector<std::string> out;
      const auto x = string_list(a), y = string_list(v);
      for (const auto& t : x) {
        for (const auto& u : y) {
          if (t == u) out.push_back(t);
          if ((t == "integer" && u == "number") || (t == "number" && u == "integer"))
            out.push_back("integer");
        }
      }
      if (out.empty()) error(path, "allOf: the types have nothing in common (unsatisfiable)");
      a = out;
    } else if (k == "properties") {
      if (!a.is_object() || !v.is_object()) error(path, "properties must be an object");
      spend(kValueSteps * v.size() * (1 + a.size()), path);
      for (const auto& [pk, ps] : v.items()) {
        if (a.contains(pk)) {
          conjoin(a[pk], ps, path + "/properties/" + escape_pointer(pk));
        } else {
          spend(weight(ps), path);
          a[pk] = ps;
        }
      }
    } else if (k == "required") {
      if (!a.is_array() || !v.is_array()) error(path, "required must be an array");
      spend(kValueSteps * v.size() * (1 + a.size()), path);
      for (const auto& r : v) {
        if (std::find(a.begin(), a.end(), r) == a.end()) a.push_back(r);
      }
    } else if (k == "additionalProperties" || k == "items" || k == "additionalItems") {
      const bool v_true = v.is_boolean() && v.get<bool>();
      const bool a_false = a.is_boolean() && !a.get<bool>();
      if (v_true || a_false) continue;
      if ((a.is_boolean() && a.get<bool>()) || (v.is_boolean() && !v.get<bool>())) {
        spend(weight(v), path);
        a = v;
      } else if (a.is_array() || v.is_array()) {
        // The tuple form of items: only the same tuple can be merged.
        spend(weight(a) + weight(v), path);
        if (a != v)
          error(path, fmt::format("allOf: cannot merge two different \"{}\" where one is a list "
                                  "of schemas (the tuple form)",
                                  k));
      } else {
        conjoin(a, v, path + "/" + k);
      }
    } else if (k == "minLength" || k == "minItems" || k == "minimum") {
      if (v.is_number() && a.is_number() && compare(to_decimal(v), to_decimal(a)) > 0) a = v;
    } else if (k == "maxLength" || k == "maxItems" || k == "maximum") {
      if (v.is_number() && a.is_number() && compare(to_decimal(v), to_decimal(a)) < 0) a = v;
    } else if (k == "exclusiveMinimum" || k == "exclusiveMaximum") {
      if (v.is_boolean() || a.is_boolean()) {
        if (!(v.is_boolean() && a.is_boolean()))
          error(path, fmt::format("allOf: cannot merge the two forms of \"{}\"", k));
        a = a.get<bool>() || v.get<bool>();
      } else if (v.is_number() && a.is_number()) {
        const int c = compare(to_decimal(v), to_decimal(a));
        if ((k == "exclusiveMinimum" && c > 0) || (k == "exclusiveMaximum" && c < 0)) a = v;
      }
    } else if (k == "pattern" || k == "format") {
      spend(weight(a) + weight(v), path);
      if (!a.is_array()) a = as_list(a);
      for (const auto& x : as_list(v)) a.push_back(x);
    } else if (k == "nullable") {
      a = a.is_boolean() && a.get<bool>() && v.is_boolean() && v.get<bool>();
    } else if (k == "uniqueItems") {
      continue;
    } else {
      spend(weight(a) + weight(v), path);
      if (a != v) error(path, fmt::format("allOf: cannot merge two \"{}\" keywords", k));
    }
  }
}

std::vector<std::string> SchemaCompiler::types_of(const json& s, const std::string& path) {
  std::vector<std::string> types;
  if (const auto it = s.find("type"); it != s.end()) {
    if (!it->is_string() && !it->is_array()) error(path, "type must be a string or an array");
    for (const auto& t : it->is_array() ? *it : json::array({*it})) {
      if (!t.is_string() ||
          std::find(std::begin(kTypes), std::end(kTypes), t.get<std::string>()) == std::end(kTypes))
        error(path, fmt::format("unknown type {}", t.dump()));
      types.push_back(t.get<std::string>());
    }
    if (types.empty()) error(path, "type is an empty list (unsatisfiable)");
  } else {
    auto any = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (any({"items", "prefixItems", "additionalItems", "minItems", "maxItems"}))
      types.push_back("array");
    if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}))
      types.push_back("number");
    if (types.empty()) types.assign(std::begin(kTypes), std::end(kTypes));
  }
  if (const auto it = s.find("nullable");
      it != s.end() && it->is_boolean() && it->get<bool>() &&
      std::find(types.begin(), types.end(), "null") == types.end())
    types.push_back("null");
  // integer is within number: keep the wider one only.
  if (std::find(types.begin(), types.end(), "number") != types.end())
    std::erase(types, std::string("integer"));
  return types;
}

ExprPtr SchemaCompiler::value(const json& schema, const std::string& path0) {
  count(path0);
  if (schema.is_boolean()) return schema.get<bool>() ? any_value() : nothing();
  if (!schema.is_object()) error(path0, "a schema must be an object or a boolean");
  check_keywords(schema, path0);
  if (depth_ > kMaxSchemaDepth)
    error(path0, fmt::format("the schema is nested deeper than {}", kMaxSchemaDepth));
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(x) { ++d; }
    ~Depth() { --d; }
  } guard(depth_);

  // A $ref alone (annotations aside) is a call of its target's rule, so recursion works.
  if (const auto r = schema.find("$ref"); r != schema.end()) {
    if (r->is_string() && !has_constraints(schema, "$ref")) {
      const std::string ref = r->get<std::string>();
      if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return grammar::ref(it->second);
      const json& t = target(ref, path0);
      // A chain of bare references that comes back to itself describes nothing.
      std::set<std::string> chain{ref};
      for (const json* c = &t; c->is_object() && c->contains("$ref");) {
        spend(1 + c->size(), path0);
        if (has_constraints(*c, "$ref") || !(*c)["$ref"].is_string()) break;
        const std::string next = (*c)["$ref"].get<std::string>();
        if (!chain.insert(next).second)
          error(path0, "$ref leads back to itself (a reference cycle)");
        c = &target(next, path0);
      }
      const uint32_t id = g_.fresh_rule(rule_name(ref.substr(ref.rfind('/') + 1)));
      ref_rules_[ref] = id;
      g_.define(id, value(t, ref));
      return grammar::ref(id);
    }
  }
  std::string path = path0;
  json storage;
  const json& s = flatten(schema, path, storage);
  if (s.is_boolean()) return s.get<bool>() ? any_value() : nothing();

  if (ExprPtr b =
          branches(s, path, [&](const json& x, const std::string& p) { return value(x, p); }))
    return b;
  if (s.contains("enum") || s.contains("const")) {
    const json& values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array()) error(path, "enum must be an array");
    if (values.size() > kMaxSchemaEnum)
      error(path, fmt::format("enum has more than {} values", kMaxSchemaEnum));
    const auto types = s.contains("type") ? types_of(s, path) : std::vector<std::string>{};
    std::vector<ExprPtr> alts;
    for (const auto& v : values) {
      bool ok = types.empty();
      for (const auto& t : types) ok = ok || json_type_is(v, t);
      if (ok) alts.push_back(literal(v));
    }
    if (alts.empty()) error(path, "no enum value has an allowed type (unsatisfiable)");
    return alt(std::move(alts));
  }
  std::vector<ExprPtr> alts;
  for (const auto& t : types_of(s, path)) alts.push_back(typed(s, path, t));
  return alt(std::move(alts));
}

ExprPtr SchemaCompiler::branches(const json& s, const std::string& path,
                                 const std::function<ExprPtr(const json&, const std::string&)>& f) {
  for (const char* key : {"anyOf", "oneOf"}) {
    const auto it = s.find(key);
    if (it == s.end()) continue;
    if (s.contains("anyOf") && s.contains("oneOf"))
      error(path, "anyOf together with oneOf is not supported");
    if (!it->is_array() || it->empty())
      error(path, fmt::format("{} must be a non-empty array", key));
    // Keywords beside the branches apply to each of them (allOf semantics).
    json rest = json::object();
    if (has_constraints(s, key)) {
      spend(weight(s), path);
      rest = s;
      rest.erase(key);
    }
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string p = fmt::format("{}/{}/{}", path, key, i);
      if (rest.empty()) {
        alts.push_back(f((*it)[i], p));
        continue;
      }
      spend(weight(rest) + weight((*it)[i]), p);
      alts.push_back(f(json{{"allOf", json::array({rest, (*it)[i]})}}, p));
    }
    return alt(std::move(alts));
  }
  return nullptr;
}

ExprPtr SchemaCompiler::value_of_type(const json& schema, const std::string& path0,
                                      const std::string& type) {
  count(path0);
  if (schema.is_boolean())
    return schema.get<bool>() ? typed(json::object(), path0, type) : nothing();
  if (!schema.is_object()) error(path0, "a schema must be an object or a boolean");
  check_keywords(schema, path0);
  std::string path = path0;
  json storage;
  const json& s = flatten(schema, path, storage);
  if (s.is_boolean()) return s.get<bool>() ? typed(json::object(), path, type) : nothing();
  if (ExprPtr b = branches(
          s, path, [&](const json& x, const std::string& p) { return value_of_type(x, p, type); }))
    return b;
  if (s.contains("enum") || s.contains("const")) {
    return enum_alternatives(
        s, path, [&](const json& v) { return json_type_is(v, type) ? literal(v) : nullptr; });
  }
  const auto types = types_of(s, path);
  auto has = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  if (type == "number") {
    if (has("number")) return typed(s, path, "number");
    if (has("integer")) return typed(s, path, "integer");
    return nothing();
  }
  return has(type.c_str()) ? typed(s, path, type) : nothing();
}

ExprPtr SchemaCompiler::enum_alternatives(const json& s, const std::string& path,
                                          const std::function<ExprPtr(const json&)>& make) {
  const json& values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
  std::vector<ExprPtr> alts;
  spend(values.is_array() ? values.size() : 1, path);
  for (const auto& v : values.is_array() ? values : json::array()) {
    if (ExprPtr e = make(v)) alts.push_back(std::move(e));
  }
  return alt(std::move(alts));
}

ExprPtr SchemaCompiler::raw_string(const json& schema, const std::string& path0) {
  count(path0);
  if (schema.is_boolean()) return schema.get<bool>() ? star(any_char()) : nothing();
  if (!schema.is_object()) error(path0, "a schema must be an object or a boolean");
  check_keywords(schema, path0);
  std::string path = path0;
  json storage;
  const json& s = flatten(schema, path, storage);
  if (s.is_boolean()) return s.get<bool>() ? star(any_char()) : nothing();
  if (ExprPtr b =
          branches(s, path, [&](const json& x, const std::string& p) { return raw_string(x, p); }))
    return b;
  if (s.contains("enum") || s.contains("const")) {
    return enum_alternatives(s, path, [&](const json& v) {
      return v.is_string() ? lit(v.get<std::string>()) : nullptr;
    });
  }
  const auto types = types_of(s, path);
  if (std::find(types.begin(), types.end(), "string") == types.end()) return nothing();
  return shared_string("raw-string", s, path, [&] { return string_content(s, path); });
}

ExprPtr SchemaCompiler::shared_string(const char* kind, const json& s, const std::string& path,
                                      const std::function<ExprPtr()>& body) {
  std::string key = kind;
  for (const char* k : {"minLength", "maxLength", "pattern", "format"}) {
    if (const auto it = s.find(k); it != s.end()) {
      spend(weight(*it), path);
      key += fmt::format("\n{}={}", k, it->dump());
    }
  }
  if (const auto it = strings_.find(key); it != strings_.end()) return ref(it->second);
  // Named after where it is first used (so a budget that runs out there names the place).
  const uint32_t id =
      g_.fresh_rule(rule_name(path) + (std::string(kind) == "raw-string" ? "-raw" : ""));
  strings_[key] = id;
  g_.define(id, body());
  return ref(id);
}

uint32_t SchemaCompiler::count_of(const json& s, const std::string& path, const char* key,
                                  uint32_t def) {
  const auto it = s.find(key);
  if (it == s.end()) return def;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    error(path, fmt::format("{} must be a non-negative integer", key));
  if (it->get<uint64_t>() > kMaxSchemaCount)
    error(path, fmt::format("{} {} is above the supported {}", key, it->dump(), kMaxSchemaCount));
  return static_cast<uint32_t>(it->get<uint64_t>());
}

// The decoded text of the strings `s` allows (lengths in characters, pattern, format).
ExprPtr SchemaCompiler::string_content(const json& s, const std::string& path) {
  const uint32_t lo = count_of(s, path, "minLength", 0),
                 hi = count_of(s, path, "maxLength", kUnbounded);
  if (hi < lo) error(path, "minLength is above maxLength (unsatisfiable)");
  std::vector<ExprPtr> parts;
  if (const auto it = s.find("pattern"); it != s.end()) {
    for (const auto& p : it->is_array() ? *it : json::array({*it})) {
      if (!p.is_string()) error(path, "pattern must be a string");
      spend(1 + p.get<std::string>().size(), path);
      try {
        parts.push_back(parse_pattern(p.get<std::string>()));
      } catch (const InvalidArgument& e) {
        error(path, e.what());
      }
    }
  }
  if (const auto it = s.find("format"); it != s.end()) {
    for (const auto& f : it->is_array() ? *it : json::array({*it})) {
      if (!f.is_string()) error(path, "format must be a string");
      parts.push_back(format_text(f.get<std::string>(), fmt::format("{} at {}", prefix_, path)));
    }
  }
  ExprPtr length = repeat(any_char(), lo, hi);
  if (parts.empty()) return length;
  if (lo > 0 || hi != kUnbounded) parts.push_back(length);
  // Intersected pairwise, round by round: a balanced tree, so that many patterns (an allOf may
  // gather thousands) nest only as deep as the logarithm of their number.
  while (parts.size() > 1) {
    std::vector<ExprPtr> next;
    for (size_t i = 0; i + 1 < parts.size(); i += 2)
      next.push_back(intersect(parts[i], parts[i + 1]));
    if (parts.size() % 2 == 1) next.push_back(parts.back());
    parts = std::move(next);
  }
  return parts[0];
}

ExprPtr SchemaCompiler::typed(const json& s, const std::string& path, const std::string& type) {
  if (type == "null") return seq({lit("null"), ws()});
  if (type == "boolean") return seq({alt({lit("true"), lit("false")}), ws()});
  if (type == "integer" || type == "number") {
    const bool integer = type == "integer";
    std::optional<Bound> lo, hi;
    auto bound = [&](const char* k, bool exclusive, std::optional<Bound>& b, bool lower) {
      const auto it = s.find(k);
      if (it == s.end() || it->is_boolean()) return;
      if (!it->is_number()) error(path, fmt::format("{} must be a number", k));
      Bound nb{to_decimal(*it), exclusive};
      if (!b) {
        b = nb;
        return;
      }
      const int c = compare(nb.value, b->value);
      if ((lower && c > 0) || (!lower && c < 0) || (c == 0 && exclusive)) b = nb;
    };
    auto flag = [&](const char* k) {
      const auto it = s.find(k);
      return it != s.end() && it->is_boolean() && it->get<bool>();
    };
    bound("minimum", flag("exclusiveMinimum"), lo, true);
    bound("exclusiveMinimum", true, lo, true);
    bound("maximum", flag("exclusiveMaximum"), hi, false);
    bound("exclusiveMaximum", true, hi, false);
    if (!lo && !hi) {
      return rule_for(type, [&] {
        return seq({number_text(std::nullopt, std::nullopt, integer, path), ws()});
      });
    }
    return seq({number_text(lo, hi, integer, fmt::format("{} at {}", prefix_, path)), ws()});
  }
  if (type == "string") {
    const bool plain = !s.contains("minLength") && !s.contains("maxLength") &&
                       !s.contains("pattern") && !s.contains("format");
    if (plain)
      return rule_for("string", [&] {
        return seq({lit("\""), star(json_char()), lit("\""), ws()});
      });
    return shared_string("json-string", s, path, [&] {
      ExprPtr content;
      if (!s.contains("pattern") && !s.contains("format")) {
        const uint32_t lo = count_of(s, path, "minLength", 0),
                       hi = count_of(s, path, "maxLength", kUnbounded);
        if (hi < lo) error(path, "minLength is above maxLength (unsatisfiable)");
        content = repeat(json_char(), lo, hi);
      } else {
        content = json_escaped(string_content(s, path));
      }
      return seq({lit("\""), content, lit("\""), ws()});
    });
  }
  if (type == "object") return object_value(s, path);
  return array_value(s, path);
}

SchemaCompiler::ObjectShape SchemaCompiler::object_shape(const json& schema,
                                                         const std::string& path0) {
  std::string path = path0;
  json storage;
  const json& s = flatten(schema, path, storage);
  ObjectShape shape;
  if (s.is_boolean()) {
    if (!s.get<bool>()) error(path, "the schema is false (unsatisfiable)");
    shape.additional = true;
    return shape;
  }
  if (!s.is_object()) error(path, "a schema must be an object or a boolean");
  check_keywords(s, path);
  if (s.contains("anyOf") || s.contains("oneOf") || s.contains("enum") || s.contains("const"))
    error(path, "anyOf, oneOf, enum and const are not supported for an object's members here");
  const auto types = types_of(s, path);
  if (std::find(types.begin(), types.end(), "object") == types.end())
    error(path, "the schema does not describe an object");
  static const json kNoProperties = json::object();
  const json& props = s.contains("properties") ? s["properties"] : kNoProperties;
  if (!props.is_object()) error(path, "properties must be an object");
  const json add = s.value("additionalProperties", json(props.empty()));
  // The members copy their schemas; each `required` name is looked for among the properties.
  spend(weight(props) + weight(add), path);
  shape.additional = !(add.is_boolean() && !add.get<bool>());
  shape.additional_schema = add.is_boolean() ? json(true) : add;
  std::vector<std::string> required;
  if (const auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) error(path, "required must be an array");
    for (const auto& r : *it) {
      if (!r.is_string()) error(path, "required must list strings");
      required.push_back(r.get<std::string>());
    }
  }
  spend((1 + props.size()) * (1 + required.size()), path);
  for (const auto& [k, v] : props.items()) {
    shape.members.push_back({k, v, path + "/properties/" + escape_pointer(k),
                             std::find(required.begin(), required.end(), k) != required.end()});
  }
  for (const auto& r : required) {
    if (props.contains(r)) continue;
    if (!shape.additional)
      error(path, fmt::format("required property \"{}\" is not allowed by additionalProperties "
                              "(unsatisfiable)",
                              r));
    shape.members.push_back({r, shape.additional_schema, path + "/additionalProperties", true});
  }
  return shape;
}

ExprPtr SchemaCompiler::not_keys(const std::vector<std::string>& keys,
                                 const std::vector<CharRange>& alphabet) {
  // A trie over the keys' characters: a string is allowed when it leaves the trie or ends at a
  // node that is not a key.
  struct Node {
    std::map<char32_t, size_t> kids;
    bool key = false;
  };
  std::vector<Node> t(1);
  if (CompileBudget* b = CompileBudget::current()) {
    uint64_t bytes = 0;
    for (const auto& k : keys) bytes += k.size();
    b->spend(keys.size() + bytes * (1 + alphabet.size()));
  }
  for (const auto& k : keys) {
    size_t cur = 0;
    for (size_t i = 0; i < k.size();) {
      const auto d = utf8::decode(k, i);
      i += d.len;
      auto [it, added] = t[cur].kids.emplace(d.cp, t.size());
      if (added) t.emplace_back();
      cur = it->second;
    }
    t[cur].key = true;
  }
  const std::vector<CharRange> plain = normalize(alphabet);
  std::function<ExprPtr(size_t)> build = [&](size_t n) -> ExprPtr {
    std::vector<ExprPtr> alts;
    if (!t[n].key) alts.push_back(empty());
    std::vector<CharRange> other = plain;
    for (const auto& [c, kid] : t[n].kids) {
      alts.push_back(seq({chr(c), build(kid)}));
      std::vector<CharRange> next;
      for (const auto& r : other) {
        if (c < r.lo || c > r.hi) {
          next.push_back(r);
          continue;
        }
        if (r.lo < c) next.push_back({r.lo, c - 1});
        if (c < r.hi) next.push_back({c + 1, r.hi});
      }
      other = std::move(next);
    }
    alts.push_back(seq({chars(other), star(chars(plain))}));
    return alt(std::move(alts));
  };
  return build(0);
}

ExprPtr SchemaCompiler::object_value(const json& s, const std::string& path) {
  const ObjectShape shape = object_shape(s, path);
  const ExprPtr comma = seq({lit(","), ws()});
  if (shape.members.empty() && shape.additional && shape.additional_schema == json(true)) {
    any_value();
    return ref(named_.at("object"));
  }
  std::vector<std::string> keys;
  for (const auto& m : shape.members) keys.push_back(m.key);
  bool optional = false;
  for (const auto& m : shape.members) optional = optional || !m.required;
  std::vector<ExprPtr> kv;
  for (const auto& m : shape.members) {
    ExprPtr v = value(m.schema, m.path);
    if (optional && v->kind != ExprKind::ref) {
      const uint32_t id = g_.fresh_rule(rule_name(m.key) + "-value");
      g_.define(id, v);
      v = ref(id);
    }
    kv.push_back(seq({lit(json_quote(m.key)), ws(), lit(":"), ws(), v}));
  }
  ExprPtr extra = empty();
  ExprPtr extra_first = nothing();
  if (shape.additional) {
    const auto plain = complement({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}});
    ExprPtr key = keys.empty() ? star(chars(plain)) : not_keys(keys, plain);
    const uint32_t id = g_.fresh_rule("additional-kv");
    g_.define(id, seq({lit("\""), key, lit("\""), ws(), lit(":"), ws(),
                       value(shape.additional_schema, path + "/additionalProperties")}));
    extra = star(seq({comma, ref(id)}));
    extra_first = seq({ref(id), extra});
  }
  // rest[i]: members i.. after at least one member was written; first[i]: before any was.
  const size_t n = kv.size();
  std::vector<ExprPtr> rest(n + 1), first(n + 1);
  rest[n] = extra;
  first[n] = opt(extra_first);
  for (size_t i = n; i-- > 0;) {
    const ExprPtr with = seq({comma, kv[i]});
    rest[i] = seq({shape.members[i].required ? with : opt(with), rest[i + 1]});
    first[i] = shape.members[i].required ? seq({kv[i], rest[i + 1]})
                                         : alt({seq({kv[i], rest[i + 1]}), first[i + 1]});
  }
  return seq({lit("{"), ws(), first[0], lit("}"), ws()});
}

ExprPtr SchemaCompiler::array_value(const json& s, const std::string& path) {
  uint32_t lo = count_of(s, path, "minItems", 0), hi = count_of(s, path, "maxItems", kUnbounded);
  if (hi < lo) error(path, "minItems is above maxItems (unsatisfiable)");
  std::vector<ExprPtr> prefix;
  json rest = true;
  std::string rest_path = path + "/items";
  auto tuple = [&](const json& items, const char* key) {
    if (!items.is_array()) error(path, fmt::format("{} must be an array", key));
    for (size_t i = 0; i < items.size(); ++i)
      prefix.push_back(value(items[i], fmt::format("{}/{}/{}", path, key, i)));
  };
  if (s.contains("prefixItems")) {
    tuple(s["prefixItems"], "prefixItems");
    rest = s.value("items", json(true));
  } else if (s.contains("items") && s["items"].is_array()) {
    tuple(s["items"], "items");
    rest = s.value("additionalItems", json(true));
    rest_path = path + "/additionalItems";
  } else {
    rest = s.value("items", json(true));
  }
  spend(weight(rest), path);
  const bool more = !(rest.is_boolean() && !rest.get<bool>());
  const auto k = static_cast<uint32_t>(prefix.size());
  if (!more) hi = std::min(hi, k);
  if (hi < lo) error(path, "minItems asks for more items than the tuple allows (unsatisfiable)");
  ExprPtr elem;
  if (more) {
    ExprPtr v = value(rest, rest_path);
    if (v->kind != ExprKind::ref) {
      const uint32_t id = g_.fresh_rule("item");
      g_.define(id, v);
      v = ref(id);
    }
    elem = v;
  }
  const ExprPtr comma = seq({lit(","), ws()});
  // tail(i): the items after the first i (i >= 1 written).
  std::function<ExprPtr(uint32_t)> tail = [&](uint32_t i) -> ExprPtr {
    if (i >= k) {
      const uint32_t need = lo > i ? lo - i : 0;
      const uint32_t can = hi == kUnbounded ? kUnbounded : hi - i;
      if (can == 0) return empty();
      return repeat(seq({comma, elem}), need, can);
    }
    if (i >= hi) return empty();
    const ExprPtr next = seq({comma, prefix[i], tail(i + 1)});
    return i >= lo ? opt(next) : next;
  };
  ExprPtr body = empty();
  if (hi > 0) {
    const ExprPtr first = seq({k > 0 ? prefix[0] : elem, tail(1)});
    body = lo == 0 ? opt(first) : first;
  }
  return seq({lit("["), ws(), body, lit("]"), ws()});
}

Grammar json_schema_grammar(const json& schema, const std::string& path_prefix) {
  const BudgetScope scope;
  Grammar g;
  const uint32_t root = g.rule_id("root");
  g.root = root;
  SchemaCompiler c(g, schema, path_prefix);
  g.define(root, c.value(schema, "#"));
  return g;
}

Grammar json_object_grammar() {
  return json_schema_grammar(json{{"type", "object"}}, "response_format");
}

}  // namespace deltafin::grammar
