// The K2 family's turn constraint (the grammar is in k3_turn.h): the same TurnSpec as K3's, laid
// over K2's markers. Every marker is one special token (the tool-call tokens too, though K2's
// tokenizer_config flags them non-special), so the grammar holds them as whole tokens and free
// text can never contain one. Arguments are JSON text, so an enforced function's `parameters`
// schema compiles straight through the JSON Schema compiler (K3 needs per-argument tags instead).
#include <fmt/format.h>

#include "core/error.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/k3_turn.h"
#include "grammar/turn_common.h"

namespace deltafin::grammar {

using json = nlohmann::ordered_json;

namespace {

constexpr uint32_t kMaxIndexDigits = 6;

class K2TurnBuilder {
 public:
  K2TurnBuilder(const TurnSpec& spec, const Tokenizer& tok)
      : spec_(spec), format_(tok.chat_format()), vocab_(TokenVocab::of(tok)) {
    auto id = [&](const char* name) {
      const auto t = tok.special_id(name);
      if (!t) {
        fail_arg("{}: the tokenizer has no {} token, which the {} turn structure needs", spec.field,
                 name, chat_format_name(format_));
      }
      return *t;
    };
    im_end_ = id("<|im_end|>");
    if (thinks()) {
      think_ = format_ == ChatFormat::k2_thinking ? id("<think>") : -1;
      think_end_ = id("</think>");
    }
    if (spec_.calls != TurnSpec::Calls::forbidden || spec_.lazy) {
      section_begin_ = id("<|tool_calls_section_begin|>");
      section_end_ = id("<|tool_calls_section_end|>");
      call_begin_ = id("<|tool_call_begin|>");
      arg_begin_ = id("<|tool_call_argument_begin|>");
      call_end_ = id("<|tool_call_end|>");
    }
  }

  Constraint build() {
    Constraint c;
    c.grammar = compile_grammar(grammar(), key(), vocab_);
    if (spec_.lazy) c.trigger = {kTokenSymbol + section_begin_};
    c.description = turn_description(spec_);
    return c;
  }

 private:
  // The turn holds a think block: the format thinks and the request has thinking on.
  bool thinks() const {
    return spec_.thinking && (format_ == ChatFormat::k2_thinking || format_ == ChatFormat::k2_5);
  }

  std::string key() const {
    return fmt::format("k2-turn {}\n{}|{}|{}|{}|{}|{}|{}\n{}\n{}\n{}", chat_format_name(format_),
                       thinks(), static_cast<int>(spec_.content), static_cast<int>(spec_.calls),
                       spec_.named.value_or(""), spec_.named.has_value(),
                       spec_.enforce_all_arguments, spec_.lazy, spec_.schema.dump(), spec_.gbnf,
                       spec_.tools.dump());
  }

  ExprPtr arguments(Grammar& g, const json& function, size_t index, bool enforce) {
    static const json kAnyObject = {{"type", "object"}};
    if (!enforce) {
      SchemaCompiler sc(g, kAnyObject, spec_.field);
      return sc.value(kAnyObject, "#");
    }
    const json params = function.contains("parameters") ? function["parameters"] : json();
    if (params.is_null()) return lit("{}");
    const std::string field = fmt::format("tools[{}].function.parameters", index);
    params_.push_back(std::make_unique<json>(params));
    SchemaCompiler sc(g, *params_.back(), field);
    return sc.value(*params_.back(), "#");
  }

  // CALL+ <|tool_calls_section_end|>, after <|tool_calls_section_begin|>.
  ExprPtr calls(Grammar& g) {
    const ExprPtr index = repeat(bytes_of({{'0', '9'}}), 1, kMaxIndexDigits);
    std::vector<ExprPtr> alts;
    for (const CallableTool& t : callable_tools(spec_)) {
      const uint32_t args = g.fresh_rule("args");
      g.define(args, arguments(g, *t.function, t.index, t.enforce_arguments));
      alts.push_back(seq({token(call_begin_), lit("functions." + t.name + ":"), index,
                          token(arg_begin_), ref(args), token(call_end_)}));
    }
    const uint32_t call = g.fresh_rule("call");
    g.define(call, alt(std::move(alts)));
    return seq({ref(call), repeat(ref(call), 0, kMaxToolCalls - 1), token(section_end_)});
  }

  ExprPtr content(Grammar& g) { return turn_content(g, spec_, *vocab_, nullptr); }

  Grammar grammar() {
    Grammar g;
    g.root = g.rule_id("root");
    if (spec_.lazy) {  // after the trigger: the calls, then the end of the turn
      g.define(g.root, seq({calls(g), token(im_end_)}));
      return g;
    }
    std::vector<ExprPtr> parts;
    if (thinks()) {
      if (think_ >= 0) parts.push_back(token(think_));
      parts.push_back(free_text());
      parts.push_back(token(think_end_));
    }
    // A forced call has no free text before it (as llama.cpp, vLLM and OpenAI's "required").
    const bool forced_free =
        spec_.calls == TurnSpec::Calls::required && spec_.content == TurnSpec::Content::free;
    parts.push_back(forced_free ? empty() : content(g));
    if (spec_.calls != TurnSpec::Calls::forbidden) {
      const ExprPtr section = seq({token(section_begin_), calls(g)});
      parts.push_back(spec_.calls == TurnSpec::Calls::required ? section : opt(section));
    }
    parts.push_back(token(im_end_));
    g.define(g.root, seq(std::move(parts)));
    return g;
  }

  const TurnSpec& spec_;
  ChatFormat format_;
  std::shared_ptr<const TokenVocab> vocab_;
  int32_t im_end_ = -1, think_ = -1, think_end_ = -1;
  int32_t section_begin_ = -1, section_end_ = -1, call_begin_ = -1, arg_begin_ = -1, call_end_ = -1;
  std::vector<std::unique_ptr<json>> params_;  // schema roots the compilers refer to
};

}  // namespace

Constraint k2_turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer) {
  if (!is_k2_family(tokenizer.chat_format()))
    fail_arg("{}: the tokenizer speaks K3's chat format, not a K2 one", spec.field);
  return build_turn(spec, [&] {
    K2TurnBuilder b(spec, tokenizer);
    return b.build();
  });
}

}  // namespace deltafin::grammar
