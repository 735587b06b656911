#include "storage/expert_step.h"

#include "core/trace.h"

namespace deltafin {

void run_as_ready(ExpertProvider& provider, const ExpertStep& step) {
  auto batch = provider.request(step.layer, step.experts);
  if (step.issued) step.issued();
  size_t index = 0;
  ExpertHandle handle;
  while (batch->next(index, handle)) {
    const auto& users = step.users[static_cast<size_t>(step.experts[index])];
    TraceSpan span(
        "expert", "compute",
        {{"layer", step.layer}, {"expert", step.experts[index]}, {"rows", users.size()}});
    step.apply(*handle, users);
    handle.reset();
  }
}

}  // namespace deltafin
