// Compiling through the vocabulary's cache (see constraint.h). Each entry point opens the compile
// budget (budget.h) around all of its stages, a schema's or grammar's parse and the automaton's
// compile, so that the cap is one for the whole compile (or joins the caller's, when one is open).
#include "grammar/constraint.h"

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/pda.h"

namespace deltafin::grammar {
namespace {

// A handle on a cached grammar that also keeps its vocabulary alive: the cache's grammars do not
// own the vocabulary that holds them (matcher.h), the handles callers get do.
std::shared_ptr<const CompiledGrammar> owning(std::shared_ptr<const CompiledGrammar> g,
                                              std::shared_ptr<const TokenVocab> vocab) {
  struct Held {
    std::shared_ptr<const TokenVocab> vocab;
    std::shared_ptr<const CompiledGrammar> grammar;
  };
  auto held = std::make_shared<const Held>(Held{std::move(vocab), std::move(g)});
  return {held, held->grammar.get()};
}

std::shared_ptr<const CompiledGrammar> cached_in(const std::string& key,
                                                 const std::shared_ptr<const TokenVocab>& vocab) {
  auto hit = vocab->cached(key);
  return hit ? owning(std::move(hit), vocab) : nullptr;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& g, const std::string& key,
                                                       std::shared_ptr<const TokenVocab> vocab,
                                                       bool use_cache) {
  const BudgetScope scope;
  if (!use_cache) return std::make_shared<const CompiledGrammar>(Pda::compile(g), vocab);
  if (auto hit = cached_in(key, vocab)) return hit;
  auto compiled = std::make_shared<const CompiledGrammar>(Pda::compile(g), *vocab);
  vocab->put(key, compiled);
  return owning(std::move(compiled), std::move(vocab));
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(const std::string& text,
                                                    std::shared_ptr<const TokenVocab> vocab,
                                                    bool use_cache) {
  const BudgetScope scope;
  const std::string key = "gbnf\n" + text;
  if (use_cache) {
    if (auto hit = cached_in(key, vocab)) return hit;
  }
  return compile_grammar(parse_gbnf(text, &vocab->lookup()), key, vocab, use_cache);
}

std::shared_ptr<const CompiledGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           bool use_cache,
                                                           const std::string& prefix) {
  const BudgetScope scope;
  const std::string key = "schema\n" + schema.dump();
  if (use_cache) {
    if (auto hit = cached_in(key, vocab)) return hit;
  }
  const Grammar g = json_schema_grammar(schema, prefix);
  try {
    return compile_grammar(g, key, vocab, use_cache);
  } catch (const BudgetExceeded& e) {
    throw BudgetExceeded(prefix + ": the schema cannot be compiled: " + e.what());
  } catch (const InvalidArgument& e) {
    // The automaton's checks speak of rules; say which field they come from.
    throw InvalidArgument(prefix + ": the schema cannot be compiled: " + e.what());
  }
}

}  // namespace deltafin::grammar
