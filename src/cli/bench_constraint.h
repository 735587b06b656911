// `deltafin bench --json-schema X` / `--grammar-file F` (bench_constraint.cpp): decode speed
// with and without a constraint, measured in one run.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "grammar/constraint.h"
#include "runtime/load.h"

namespace deltafin::cli {

// Runs `reps` pairs of generations and returns their figures; with `text`, also prints them.
nlohmann::json bench_constraint(LoadedEngine& engine,
                                const std::shared_ptr<const grammar::Constraint>& constraint,
                                int gen_tokens, int reps, float temperature, bool text);

}  // namespace deltafin::cli
