// Diagnostics go to stderr (stdout carries generated text and machine-readable output only).
#pragma once

#include <fmt/format.h>

#include <cstdio>

namespace deltafin {

enum class LogLevel { kQuiet = 0, kInfo = 1, kDebug = 2 };

LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::kInfo) {
    fmt::print(stderr, "{}\n", fmt::format(f, std::forward<Args>(args)...));
  }
}

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::kDebug) {
    fmt::print(stderr, "[debug] {}\n", fmt::format(f, std::forward<Args>(args)...));
  }
}

template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print(stderr, "warning: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deltafin
