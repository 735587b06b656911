#include "cli/error_text.h"

#include <algorithm>

#include "core/json_parse.h"

namespace deltafin::cli {

std::string flag_of(const std::string& setting) {
  std::string flag = "--" + setting;
  std::replace(flag.begin(), flag.end(), ' ', '-');
  return flag;
}

std::string error_text(const std::exception& e) {
  if (const auto* s = dynamic_cast<const SettingError*>(&e))
    return s->worded(flag_of(s->setting()));
  // json_error_text: a JSON library error that escaped its caller loses its internal prefix.
  return json_error_text(e);
}

std::string validator_text(const SettingError& e) {
  return e.value().empty() ? e.problem() : e.value() + ": " + e.problem();
}

}  // namespace deltafin::cli
