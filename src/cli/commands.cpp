#include "cli/commands.h"

namespace deltafin::cli {

void register_all(CLI::App& app) { (void)app; }

}  // namespace deltafin::cli
