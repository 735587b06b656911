// How the CLI words a library error. Layers below the front ends name a setting in plain words
// (core/error.h: SettingError, "memory budget 1G: ..."); the CLI calls a setting by its flag,
// and its flags are named after the settings: the words joined by '-' ("memory budget" ->
// --memory-budget, "draft max" -> --draft-max, "model" -> --model).
#pragma once

#include <exception>
#include <string>

#include "core/error.h"

namespace deltafin::cli {

// The flag of a setting: "--" + its words joined by '-'.
std::string flag_of(const std::string& setting);
// One line for `e`: a SettingError with the flag ("--memory-budget 1G: ..."), anything else
// as the library said it.
std::string error_text(const std::exception& e);
// What a flag validator reports for a SettingError of its own flag (CLI11 puts the flag first):
// "VALUE: PROBLEM".
std::string validator_text(const SettingError& e);

}  // namespace deltafin::cli
