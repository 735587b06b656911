// The work one compile of grammars and schemas may do, counted in steps, with a wall-clock
// backstop and a way to stop it when whoever asked for it has gone.
//
// A schema, GBNF grammar or pattern comes from a client, so its compile must be bounded by a cap
// that an attacker cannot stretch and that a test can observe. Time alone is neither: a hostile
// schema under a 10 s clock still costs 10 s of CPU per request, and a test of a clock is a
// timed assertion. So every loop of the compile whose length depends on the input — merging
// `allOf` and `$ref` (JSON values copied and compared), building and determinising the automaton
// (states, edges and subsets visited), intersecting patterns, the checks after — charges the
// steps it does to the budget of the compile in progress, and the compile is refused
// (BudgetExceeded, an InvalidArgument: a 400 in the server) once max_steps are spent. One step is
// one elementary operation; kMaxCompileSteps takes well under a second on a current core, and the
// same input is refused at the same step on every machine and in every build, sanitizers
// included. The clock (max_seconds) stays as a backstop behind the steps, and every
// kCheckEverySteps the `cancelled` callback is asked whether to go on: the server passes its
// ConnectionProbe, so a compile whose client left stops (CompileCancelled) instead of burning on.
//
// A budget belongs to a thread: whoever starts a compile opens one (CompileBudget), and every
// grammar and schema compiled on that thread until it closes charges it. The grammar layer's
// entry points (json_schema_grammar, SchemaCompiler, Pda::compile, compile_*, k3_turn_constraint)
// open a default one when none is open (BudgetScope), so every compile is bounded even when its
// caller sets nothing; an entry point that runs several stages (a schema, then its automaton)
// opens it around all of them, so the cap is for the whole compile. The server opens one per
// request around the parsing of its body: one request's schemas, tools and grammars share it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "core/error.h"
#include "core/timer.h"

namespace deltafin::grammar {

// Sanitizer builds run the compiler ~10x slower; the clock backstop scales with them so that a
// compile that takes a second in a release build is not refused there. (The step cap does not
// scale: it is the same everywhere.)
inline constexpr double kCompileSlowdown = kSanitizedBuild ? 10 : 1;

inline constexpr uint64_t kMaxCompileSteps = 100'000'000;            // steps of one compile
inline constexpr double kMaxCompileSeconds = 10 * kCompileSlowdown;  // the backstop
inline constexpr uint64_t kCheckEverySteps = 1u << 15;  // clock and `cancelled` asked this often

// The budget ran out (steps or the clock). A request error: the input asks for too much.
class BudgetExceeded : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// The `cancelled` callback said stop: nobody wants the result. Not a request error (not an
// InvalidArgument), so no handler mistakes it for one and answers it as a 400.
class CompileCancelled : public Error {
 public:
  using Error::Error;
};

struct BudgetOptions {
  uint64_t max_steps = kMaxCompileSteps;
  double max_seconds = kMaxCompileSeconds;
  std::function<bool()> cancelled;  // asked every kCheckEverySteps; true stops the compile
};

class CompileBudget {
 public:
  // Opens this budget on the calling thread: compiles there charge it until it is destroyed
  // (budgets nest; the innermost one is charged). Budgets must close in the reverse order.
  explicit CompileBudget(BudgetOptions options = {});
  ~CompileBudget();
  CompileBudget(const CompileBudget&) = delete;
  CompileBudget& operator=(const CompileBudget&) = delete;

  // The budget compiles on this thread charge now, or null when none is open.
  static CompileBudget* current();

  // Charges `steps`. Throws BudgetExceeded when the steps pass max_steps (checked on every call)
  // or the clock passes max_seconds, CompileCancelled when `cancelled` says so (both checked
  // every kCheckEverySteps).
  void spend(uint64_t steps) {
    used_ += steps;
    if (used_ > options_.max_steps || used_ >= next_check_) check();
  }
  uint64_t used() const { return used_; }
  const BudgetOptions& options() const { return options_; }

 private:
  void check();

  BudgetOptions options_;
  uint64_t used_ = 0;
  uint64_t next_check_ = kCheckEverySteps;
  double deadline_ = 0;
  CompileBudget* outer_ = nullptr;
};

// The budget of the compile in progress on this thread: the open one, or a default one opened
// for the scope's life when none is open (what the grammar layer's entry points use).
class BudgetScope {
 public:
  BudgetScope() {
    if (CompileBudget::current() == nullptr) own_.emplace();
  }
  CompileBudget& budget() const { return *CompileBudget::current(); }

 private:
  std::optional<CompileBudget> own_;
};

}  // namespace deltafin::grammar
