// The compile budget (see budget.h): a thread's stack of open budgets, and the checks that run
// every kCheckEverySteps so that the clock and the cancel callback cost nothing per step.
#include "grammar/budget.h"

#include "core/timer.h"

namespace deltafin::grammar {

namespace {
thread_local CompileBudget* t_budget = nullptr;
}  // namespace

CompileBudget::CompileBudget(BudgetOptions options)
    : options_(std::move(options)),
      deadline_(now_seconds() + options_.max_seconds),
      outer_(t_budget) {
  t_budget = this;
}

CompileBudget::~CompileBudget() {
  t_budget = outer_;
}

CompileBudget* CompileBudget::current() {
  return t_budget;
}

void CompileBudget::check() {
  if (used_ > options_.max_steps)
    throw BudgetExceeded(fmt::format(
        "compiling needs more than {} steps of work, the limit for one request's grammars and "
        "schemas (fewer or simpler patterns, smaller allOf / $ref merges, bounded repetitions "
        "and fewer alternatives stay within it)",
        options_.max_steps));
  next_check_ = used_ + kCheckEverySteps;
  if (options_.cancelled && options_.cancelled())
    throw CompileCancelled("compiling was stopped: the request's client went away");
  if (now_seconds() > deadline_)
    throw BudgetExceeded(
        fmt::format("compiling took longer than the limit of {} s (after {} steps of work)",
                    options_.max_seconds, used_));
}

}  // namespace deltafin::grammar
