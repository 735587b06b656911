#include "grammar/constraint.h"

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/pda.h"

namespace deltafin::grammar {

std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& g, const std::string& key,
                                                       std::shared_ptr<const TokenVocab> vocab,
                                                       bool use_cache) {
  if (use_cache) {
    if (auto hit = vocab->cached(key)) return hit;
  }
  auto compiled = std::make_shared<const CompiledGrammar>(Pda::compile(g), vocab);
  if (use_cache) vocab->put(key, compiled);
  return compiled;
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(const std::string& text,
                                                    std::shared_ptr<const TokenVocab> vocab,
                                                    bool use_cache) {
  const std::string key = "gbnf\n" + text;
  if (use_cache) {
    if (auto hit = vocab->cached(key)) return hit;
  }
  return compile_grammar(parse_gbnf(text, &vocab->lookup()), key, vocab, use_cache);
}

std::shared_ptr<const CompiledGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           bool use_cache,
                                                           const std::string& prefix) {
  const std::string key = "schema\n" + schema.dump();
  if (use_cache) {
    if (auto hit = vocab->cached(key)) return hit;
  }
  const Grammar g = json_schema_grammar(schema, prefix);
  try {
    return compile_grammar(g, key, vocab, use_cache);
  } catch (const InvalidArgument& e) {
    // The automaton's checks speak of rules; say which field they come from.
    throw InvalidArgument(prefix + ": the schema cannot be compiled: " + e.what());
  }
}

}  // namespace deltafin::grammar
