// K3's turn constraint (k3_turn.h has the grammar) and the dispatch to the K2 family's
// (k2_turn.cpp) by the tokenizer's chat format.
#include "grammar/k3_turn.h"

#include <fmt/format.h>

#include "core/error.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/turn_common.h"
#include "tokenizer/chat.h"

namespace deltafin::grammar {

using json = nlohmann::ordered_json;

namespace {

const char* const kArgTypes[] = {"string", "number", "boolean", "null", "object", "array"};

std::string attr_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

class TurnBuilder {
 public:
  TurnBuilder(const TurnSpec& spec, const Tokenizer& tok)
      : spec_(spec), vocab_(TokenVocab::of(tok)) {
    auto id = [&](const char* name) {
      const auto t = tok.special_id(name);
      if (!t)
        fail_arg("{}: the tokenizer has no {} token, which K3's turn structure needs", spec.field,
                 name);
      return *t;
    };
    open_ = id(kOpenMarker);
    close_ = id(kCloseMarker);
    sep_ = id(kSepMarker);
    eom_ = id(kEndOfMsgMarker);
  }

  Constraint build() {
    Constraint c;
    c.grammar = compile_grammar(grammar(), key(), vocab_);
    if (spec_.lazy) c.trigger = trigger();
    c.description = description();
    return c;
  }

  std::string key() const {
    return fmt::format("k3-turn\n{}|{}|{}|{}|{}|{}|{}\n{}\n{}\n{}", spec_.thinking,
                       static_cast<int>(spec_.content), static_cast<int>(spec_.calls),
                       spec_.named.value_or(""), spec_.named.has_value(),
                       spec_.enforce_all_arguments, spec_.lazy, spec_.schema.dump(), spec_.gbnf,
                       spec_.tools.dump());
  }

  std::vector<int32_t> trigger() const {
    std::vector<int32_t> t{kTokenSymbol + open_};
    for (const char c : std::string("tools")) t.push_back(static_cast<uint8_t>(c));
    t.push_back(kTokenSymbol + sep_);
    return t;
  }

 private:
  ExprPtr open_tag(const std::string& header) const {
    return seq({token(open_), lit(header), token(sep_)});
  }
  ExprPtr close_tag(const std::string& name) const {
    return seq({token(close_), lit(name), token(sep_)});
  }

  std::string description() const { return turn_description(spec_); }

  // One argument tag for property `key` with `schema`: an alternative per JSON type it allows.
  ExprPtr argument(SchemaCompiler& sc, const ExprPtr& key, const json& schema,
                   const std::string& path) {
    std::vector<ExprPtr> alts;
    for (const char* t : kArgTypes) {
      const ExprPtr v = std::string(t) == "string" ? sc.raw_string(schema, path)
                                                   : sc.value_of_type(schema, path, t);
      if (v->kind == ExprKind::nothing) continue;
      alts.push_back(
          seq({token(open_), lit("argument key=\""), key, lit(fmt::format("\" type=\"{}\"", t)),
               token(sep_), v, close_tag("argument")}));
    }
    return alt(std::move(alts));
  }

  // Any arguments: keys of attribute text, any type, well-formed values.
  ExprPtr generic_arguments(Grammar& g) {
    static const json kAny = true;
    SchemaCompiler sc(g, kAny, spec_.field, &strings_);
    const ExprPtr key = plus(chars({{'"', '"'}, {'&', '&'}, {0, 0x1F}}, true));
    const uint32_t id = g.fresh_rule("any-argument");
    g.define(id, argument(sc, key, kAny, "#"));
    return star(ref(id));
  }

  ExprPtr arguments(Grammar& g, const json& function, size_t index, bool enforce) {
    if (!enforce) return generic_arguments(g);
    const json params = function.contains("parameters") ? function["parameters"] : json();
    if (params.is_null()) return empty();
    const std::string field = fmt::format("tools[{}].function.parameters", index);
    params_.push_back(std::make_unique<json>(params));
    SchemaCompiler sc(g, *params_.back(), field, &strings_);
    const auto shape = sc.object_shape(*params_.back(), "#");
    std::vector<ExprPtr> args;
    std::vector<std::string> keys;
    for (const auto& m : shape.members) {
      keys.push_back(m.key);
      ExprPtr a = argument(sc, lit(attr_escape(m.key)), m.schema, m.path);
      if (a->kind == ExprKind::nothing) {
        if (m.required)
          fail_arg("{}: property \"{}\" allows no value K3 can write (unsatisfiable) at {}", field,
                   m.key, m.path);
        continue;
      }
      const uint32_t id = g.fresh_rule("arg");
      g.define(id, a);
      args.push_back(m.required ? ref(id) : opt(ref(id)));
    }
    if (shape.additional) {
      const auto alphabet = complement({{'"', '"'}, {'&', '&'}, {0, 0x1F}});
      const ExprPtr key =
          keys.empty() ? plus(chars(alphabet))
                       : intersect(plus(chars(alphabet)), SchemaCompiler::not_keys(keys, alphabet));
      const uint32_t id = g.fresh_rule("extra-arg");
      g.define(id, argument(sc, key, shape.additional_schema, "#/additionalProperties"));
      args.push_back(star(ref(id)));
    }
    return seq(std::move(args));
  }

  ExprPtr tools_block(Grammar& g) {
    // One rule per callable function: its name in the call header and its arguments.
    struct Callable {
      std::string name;
      uint32_t args;
    };
    std::vector<Callable> callables;
    for (const CallableTool& t : callable_tools(spec_)) {
      const uint32_t id = g.fresh_rule("args");
      g.define(id, arguments(g, *t.function, t.index, t.enforce_arguments));
      callables.push_back({t.name, id});
    }
    auto call = [&](int k) {
      std::vector<ExprPtr> alts;
      for (const auto& c : callables) {
        alts.push_back(
            seq({open_tag(fmt::format("call tool=\"{}\" index=\"{}\"", attr_escape(c.name), k)),
                 ref(c.args), close_tag("call")}));
      }
      return alt(std::move(alts));
    };
    ExprPtr calls = empty();
    for (int k = kMaxToolCalls; k >= 1; --k)
      calls = k == 1 ? seq({call(1), calls}) : opt(seq({call(k), calls}));
    return seq({calls, close_tag("tools")});
  }

  ExprPtr content(Grammar& g) { return turn_content(g, spec_, *vocab_, &strings_); }

  Grammar grammar() {
    Grammar g;
    g.root = g.rule_id("root");
    const ExprPtr end = seq({close_tag("message"), token(eom_)});
    if (spec_.lazy) {
      // After the trigger (`<|open|>tools<|sep|>`): the calls, then the end of the turn.
      g.define(g.root, seq({tools_block(g), end}));
      return g;
    }
    std::vector<ExprPtr> parts;
    if (spec_.thinking)
      parts.push_back(seq({free_text(), close_tag("think"), open_tag("response")}));
    // A forced call has no free text before it (as llama.cpp, vLLM and OpenAI's "required").
    const bool forced_free =
        spec_.calls == TurnSpec::Calls::required && spec_.content == TurnSpec::Content::free;
    parts.push_back(forced_free ? empty() : content(g));
    parts.push_back(close_tag("response"));
    if (spec_.calls != TurnSpec::Calls::forbidden) {
      const ExprPtr block = seq({open_tag("tools"), tools_block(g)});
      parts.push_back(spec_.calls == TurnSpec::Calls::required ? block : opt(block));
    }
    parts.push_back(end);
    g.define(g.root, seq(std::move(parts)));
    return g;
  }

  const TurnSpec& spec_;
  std::shared_ptr<const TokenVocab> vocab_;
  int32_t open_ = 0, close_ = 0, sep_ = 0, eom_ = 0;
  std::vector<std::unique_ptr<json>> params_;  // schema roots the compilers refer to
  // The string rules of all the turn's schemas (a format or pattern the content schema and the
  // tools repeat is compiled once).
  std::map<std::string, uint32_t> strings_;
};

}  // namespace

ExprPtr turn_content(Grammar& g, const TurnSpec& spec, const TokenVocab& vocab,
                     std::map<std::string, uint32_t>* strings) {
  switch (spec.content) {
    case TurnSpec::Content::free:
      return free_text();
    case TurnSpec::Content::json_schema: {
      SchemaCompiler sc(g, spec.schema, spec.field, strings);
      return sc.value(spec.schema, "#");
    }
    case TurnSpec::Content::json_object: {
      static const json kObject = {{"type", "object"}};
      SchemaCompiler sc(g, kObject, spec.field, strings);
      return sc.value(kObject, "#");
    }
    case TurnSpec::Content::gbnf:
      return ref(import_rules(g, parse_gbnf(spec.gbnf, &vocab.lookup()), "user-"));
  }
  return free_text();
}

std::vector<CallableTool> callable_tools(const TurnSpec& spec) {
  if (!spec.tools.is_array() || spec.tools.empty())
    fail_arg("{}: tool calls are to be enforced but there are no tools", spec.field);
  std::vector<CallableTool> out;
  for (size_t i = 0; i < spec.tools.size(); ++i) {
    const json& f = spec.tools[i].contains("function") ? spec.tools[i]["function"] : spec.tools[i];
    if (!f.contains("name") || !f["name"].is_string())
      fail_arg("{}: tools[{}].function.name is missing", spec.field, i);
    std::string name = f["name"].get<std::string>();
    if (spec.named && *spec.named != name) continue;
    const bool strict = f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
    out.push_back({std::move(name), i, &f, strict || spec.enforce_all_arguments});
  }
  if (out.empty())
    fail_arg("{}: tool_choice names function \"{}\", which is not among the tools", spec.field,
             spec.named.value_or(""));
  return out;
}

std::string turn_description(const TurnSpec& spec) {
  std::vector<std::string> parts;
  switch (spec.content) {
    case TurnSpec::Content::json_schema:
      parts.push_back("json_schema");
      break;
    case TurnSpec::Content::json_object:
      parts.push_back("json_object");
      break;
    case TurnSpec::Content::gbnf:
      parts.push_back("grammar");
      break;
    case TurnSpec::Content::free:
      break;
  }
  if (spec.calls == TurnSpec::Calls::required) parts.push_back("tool call required");
  if (spec.named) parts.push_back("tool " + *spec.named);
  if (spec.lazy) parts.push_back("tool calls (lazy)");
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "turn structure" : out;
}

Constraint k3_turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer) {
  return turn_constraint(spec, tokenizer);
}

Constraint turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer) {
  if (is_k2_family(tokenizer.chat_format())) return k2_turn_constraint(spec, tokenizer);
  return build_turn(spec, [&] {
    const BudgetScope scope;  // one budget for the turn's schemas, grammar and automaton
    TurnBuilder b(spec, tokenizer);
    return b.build();
  });
}

Constraint raw_constraint_gbnf(const std::string& gbnf, const Tokenizer& tokenizer) {
  return {compile_gbnf(gbnf, TokenVocab::of(tokenizer)), {}, "grammar"};
}

Constraint raw_constraint_schema(const json& schema, const Tokenizer& tokenizer,
                                 const std::string& field) {
  return {compile_json_schema(schema, TokenVocab::of(tokenizer), true, field), {}, "json_schema"};
}

}  // namespace deltafin::grammar
