#include "storage/expert_step.h"

namespace deltafin {

void run_as_ready(ExpertProvider& provider, const ExpertStep& step) {
  auto batch = provider.request(step.layer, step.experts);
  if (step.issued) step.issued();
  size_t index = 0;
  ExpertHandle handle;
  while (batch->next(index, handle)) {
    step.apply(*handle, step.users[static_cast<size_t>(step.experts[index])]);
    handle.reset();
  }
}

}  // namespace deltafin
