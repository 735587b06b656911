// What the K3 turn grammar (k3_turn.cpp) and the K2-family one (k2_turn.cpp) share: the tools a
// turn may call, checked once, and the content it may write. Each format writes the structure
// around them (tags, special tokens) its own way. Internal to src/grammar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/constraint.h"
#include "grammar/ir.h"
#include "grammar/k3_turn.h"
#include "grammar/vocab.h"

namespace deltafin::grammar {

// A tool the turn may call: its name, its place in spec.tools, its function object and whether
// its arguments are enforced (its `strict`, or the spec's enforce_all_arguments).
struct CallableTool {
  std::string name;
  size_t index = 0;
  const nlohmann::ordered_json* function = nullptr;
  bool enforce_arguments = false;
};
// The tools of a turn whose calls are enforced: every one of spec.tools, or only spec.named.
// Throws InvalidArgument naming spec.field when there are no tools, a tool has no name, or the
// named function is not among them.
std::vector<CallableTool> callable_tools(const TurnSpec& spec);

// Any bytes: a turn's free text.
inline ExprPtr free_text() {
  return star(bytes_of({{0, 255}}));
}

// The content the spec allows: free text, a value of its JSON Schema, any JSON object, or its
// GBNF grammar (rules imported under "user-"). `strings`: where schema string rules are shared
// (SchemaCompiler), or nullptr.
ExprPtr turn_content(Grammar& g, const TurnSpec& spec, const TokenVocab& vocab,
                     std::map<std::string, uint32_t>* strings);

// A turn's constraint from `build` (which makes the format's builder and builds), after the check
// every format makes alike (a lazy grammar only over free content); a grammar error it raises is
// named after spec.field, the request field the turn came from.
template <class Build>
Constraint build_turn(const TurnSpec& spec, Build&& build) {
  if (spec.lazy && spec.content != TurnSpec::Content::free)
    fail_arg("{}: a lazy grammar needs free content", spec.field);
  try {
    return build();
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.rfind("grammar:", 0) == 0) throw InvalidArgument(spec.field + ": " + what);
    throw;
  }
}

}  // namespace deltafin::grammar
