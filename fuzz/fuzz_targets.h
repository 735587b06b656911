// The fuzz targets' bodies, one function per parser, shared by two front ends: the libFuzzer
// programs (fuzz/main.cpp, built only with clang and DELTAFIN_FUZZ=ON) and the ordinary test
// suite (tests/fuzz_regress_test.cpp), which replays every kept input under tests/data/fuzz so a
// crash the fuzzer once found stays fixed in every build, sanitizers or not.
//
// Contract of a body: any input is allowed; the parser may refuse it only with deltafin::Error
// (or ApiError for the request validator), which is the project's rule for bad input. Anything
// else escaping (a library exception, a crash, a sanitizer report, a failed invariant checked
// with fuzz_check) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace deltafin::fuzz {

using Body = void (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;
  Body body;
};

// Every target, in the order `make fuzz` runs them.
const Target* targets(size_t* count);
const Target* find_target(const std::string& name);

// Aborts with a message (a fuzzer finding) when an invariant does not hold.
void fuzz_check(bool ok, const char* what);

// A folder for the targets that must write files (created once per process under
// $DELTAFIN_FUZZ_TMP, else the system temporary folder; removed at exit).
const std::string& scratch_dir();

// Test data (tests/data) as compiled in; the targets load the test tokenizer from it.
std::string test_data_dir();

}  // namespace deltafin::fuzz
