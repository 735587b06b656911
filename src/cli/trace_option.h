// `--trace FILE` of run, chat, bench and serve (core/trace.h, docs/TRACING.md). A header of its
// own rather than cli/common.h: only the four commands that trace include it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace deltafin::cli {

// Adds --trace FILE: the command's timeline in the Trace Event Format.
void add_trace_option(CLI::App* cmd, std::string& path);

// A command's trace: started by the constructor (the file is created then, so a path that cannot
// be written fails before any work; "" traces nothing) and written by finish(). A command that
// fails leaves no trace file: the destructor removes the temporary.
class TraceSession {
 public:
  explicit TraceSession(const std::string& path);
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;
  void finish();  // writes the file and says so on stderr; throws IoError when it cannot

 private:
  std::string path_;
  bool open_ = false;
};

}  // namespace deltafin::cli
