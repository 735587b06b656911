// --trace FILE for the commands that run the engine: the option and the session that starts the
// tracer before the model loads and writes the file when the command ends (cli/trace_option.h).
#include "cli/trace_option.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/trace.h"

namespace deltafin::cli {

void add_trace_option(CLI::App* cmd, std::string& path) {
  cmd->add_option("--trace", path,
                  "Write a timeline of the command to FILE (Trace Event Format JSON: open it in "
                  "ui.perfetto.dev or chrome://tracing; docs/TRACING.md)")
      ->type_name("FILE");
}

TraceSession::TraceSession(const std::string& path) : path_(path) {
  if (path_.empty()) return;
  trace_thread_name("main");
  try {
    trace_start(path_);
  } catch (const IoError& e) {
    fail_io("--trace {}", e.what());  // the tracer names the file; the flag is ours to name
  }
  open_ = true;
}

TraceSession::~TraceSession() {
  if (open_) trace_abandon();
}

void TraceSession::finish() {
  if (!open_) return;
  open_ = false;
  const int64_t n = trace_finish();
  fmt::print(stderr, "trace: {} events written to {}\n", n, path_);
}

}  // namespace deltafin::cli
