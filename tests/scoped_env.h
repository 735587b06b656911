// test::ScopedEnv: an environment variable changed for one scope (a header of its own, so that
// the few tests that change the environment do not make every test file depend on it).
#pragma once

#include <cstdlib>
#include <string>
#include <utility>

namespace deltafin::test {

// An environment variable set (or, with no value, unset) for a scope and put back as it was:
// gtest runs many tests in one process, and one that leaves DELTAFIN_CACHE unset takes the
// process's own cache folder from every test after it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, previous_;
  bool had_ = false;
};

inline ScopedEnv::ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
  if (const char* was = std::getenv(name_.c_str()); was != nullptr) {
    had_ = true;
    previous_ = was;
  }
  if (value != nullptr)
    ::setenv(name_.c_str(), value, 1);
  else
    ::unsetenv(name_.c_str());
}

inline ScopedEnv::~ScopedEnv() {
  if (had_)
    ::setenv(name_.c_str(), previous_.c_str(), 1);
  else
    ::unsetenv(name_.c_str());
}

}  // namespace deltafin::test
