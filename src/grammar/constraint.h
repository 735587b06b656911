// Compiling what a request asks to enforce into a CompiledGrammar for a vocabulary, through
// the vocabulary's cache: the same grammar text or schema (with the same options) compiles
// once per process and its per-node masks are then shared by every request that uses it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/ir.h"
#include "grammar/matcher.h"
#include "grammar/vocab.h"

namespace deltafin::grammar {

// A compiled constraint and how it starts: `trigger` empty = from the first token (matcher.h).
struct Constraint {
  std::shared_ptr<const CompiledGrammar> grammar;
  std::vector<int32_t> trigger;
  std::string description;  // what is enforced ("json_schema", "tool call required", ...)
};

// GBNF text (llama.cpp syntax; gbnf.h).
std::shared_ptr<const CompiledGrammar> compile_gbnf(const std::string& text,
                                                    std::shared_ptr<const TokenVocab> vocab,
                                                    bool use_cache = true);
// A JSON Schema; `prefix` names the field it came from in error messages.
std::shared_ptr<const CompiledGrammar> compile_json_schema(
    const nlohmann::ordered_json& schema, std::shared_ptr<const TokenVocab> vocab,
    bool use_cache = true, const std::string& prefix = "json_schema");
// A grammar built in code, cached under `key` (which must identify it completely).
std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& g, const std::string& key,
                                                       std::shared_ptr<const TokenVocab> vocab,
                                                       bool use_cache = true);

}  // namespace deltafin::grammar
