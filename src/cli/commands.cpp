#include "cli/commands.h"

namespace deltafin::cli {

void register_all(CLI::App& app) {
  register_tokenize(app);
  register_render(app);
}

}  // namespace deltafin::cli
