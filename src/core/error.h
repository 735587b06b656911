// Errors. The library throws deltafin::Error with a message that names the file, tensor or
// field at fault and what was expected; the CLI prints it as one line, the server turns it
// into an OpenAI-shaped error. Nothing is silently skipped or clamped.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace deltafin {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A user-facing request or argument error (bad flag, bad request field); servers map it to 400.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message) : Error(message) {}
};

// A setting every front end offers under its own name — the CLI's `--memory-budget`, the C API's
// and Python's `memory_budget` — holding a value that cannot be used. Layers below the front
// ends name the setting in plain words ("memory budget", "draft max") and never a front end's
// spelling of it; what() reads "memory budget 1G: <problem>". A front end that spells the
// setting otherwise words the message itself from its parts: the CLI with the flag
// (cli/common.h: cli_error_text), the C API with the parameter field (capi.cpp: guard).
class SettingError : public InvalidArgument {
 public:
  SettingError(std::string setting, std::string value, std::string problem)
      : InvalidArgument(compose(setting, value, problem)),
        setting_(std::move(setting)),
        value_(std::move(value)),
        problem_(std::move(problem)) {}
  const std::string& setting() const { return setting_; }
  const std::string& value() const { return value_; }
  const std::string& problem() const { return problem_; }
  // The message with the setting called `name`: "<name> <value>: <problem>".
  std::string worded(const std::string& name) const { return compose(name, value_, problem_); }

 private:
  static std::string compose(const std::string& name, const std::string& value,
                             const std::string& problem) {
    return name + (value.empty() ? "" : " " + value) + ": " + problem;
  }
  std::string setting_, value_, problem_;
};

// I/O failures: short reads, truncated or replaced files. Confined to the request that hit it.
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_arg(fmt::format_string<Args...> f, Args&&... args) {
  throw InvalidArgument(fmt::format(f, std::forward<Args>(args)...));
}

// Throws SettingError: the setting `setting` (plain words) holds `value`, and the formatted text
// says what is wrong with it and what was expected.
template <typename... Args>
[[noreturn]] void fail_setting(const std::string& setting, const std::string& value,
                               fmt::format_string<Args...> f, Args&&... args) {
  throw SettingError(setting, value, fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_io(fmt::format_string<Args...> f, Args&&... args) {
  throw IoError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deltafin
