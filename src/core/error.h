// Errors. The library throws deltafin::Error with a message that names the file, tensor or
// field at fault and what was expected; the CLI prints it as one line, the server turns it
// into an OpenAI-shaped error. Nothing is silently skipped or clamped.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

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

template <typename... Args>
[[noreturn]] void fail_io(fmt::format_string<Args...> f, Args&&... args) {
  throw IoError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deltafin
