// Entry point of the `deltafin` program: parses the command line with CLI11 and dispatches to
// one subcommand. Errors from the library surface as one line on stderr and exit status 1;
// usage errors (unknown flag, missing value, and the subcommands' own UsageError for values the
// parser cannot check) exit 2 with a pointer to the help of the subcommand that was used.
#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/error_text.h"
#include "core/error.h"
#include "draft/draft_model.h"

namespace {

// "deltafin run --help" when a subcommand was named, else "deltafin --help".
std::string help_for(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    return "deltafin " + sub->get_name() + " --help";
  return "deltafin --help";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltafin: run Kimi K3 on one machine, exactly, from the original checkpoint",
               "deltafin"};
  app.set_version_flag("-V,--version", DELTAFIN_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);

  deltafin::cli::register_all(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "deltafin: %s (see %s)\n", e.what(), help_for(app).c_str());
    return 2;
  } catch (const deltafin::cli::UsageError& e) {
    std::fprintf(stderr, "deltafin: %s (see %s)\n", e.what(), help_for(app).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltafin: %s\n", deltafin::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
