// The storage providers' way of carrying out a routed-expert step (model/experts.h): request all
// of the step's experts at once (reads issued together, in file order), tell the model they are
// issued, then apply each expert on the CPU as soon as its weights are ready — whatever order the
// reads complete in. The step's result does not depend on that order (each expert writes only its
// own rows' outputs).
#pragma once

#include "model/experts.h"

namespace deltafin {

void run_as_ready(ExpertProvider& provider, const ExpertStep& step);

}  // namespace deltafin
