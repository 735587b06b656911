#include "tensor/tensor_info.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace deltafin {

std::string shape_to_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string TensorInfo::shape_string() const {
  return shape_to_string(shape);
}

}  // namespace deltafin
