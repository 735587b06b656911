// `deltafin bench --turns N` (bench_turns.cpp): prefill per turn of a growing conversation with
// and without the prefix store.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/load.h"

namespace deltafin::cli {

// Runs the turns and returns one object per turn; with `text`, also prints a table.
nlohmann::json bench_turns(LoadedEngine& engine, int turns, int prompt_tokens, int gen_tokens,
                           bool text);

}  // namespace deltafin::cli
