// Entry point of the `deltafin` program: parses the command line with CLI11 and dispatches to
// one subcommand. Errors from the library surface as one line on stderr and exit status 1;
// usage errors (unknown flag, missing value) exit 2 with the parser's message.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

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
    std::fprintf(stderr, "deltafin: %s (see deltafin --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltafin: %s\n", e.what());
    return 1;
  }
  return 0;
}
