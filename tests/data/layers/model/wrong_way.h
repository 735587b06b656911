// A fixture for the include check (cmake/check_layers.cmake): a model header that reaches up
// into the storage layer, which the build must refuse.
#pragma once

#include "core/error.h"
#include "storage/expert_store.h"
