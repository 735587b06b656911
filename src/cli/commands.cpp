#include "cli/commands.h"

namespace deltafin::cli {

void register_all(CLI::App& app) {
  register_logits(app);
  register_inspect(app);
}

}  // namespace deltafin::cli
