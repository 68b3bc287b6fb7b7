// PyTorch-style printing. ---- to be completed ----
#include <ostream>

#include "forge/core/tensor.h"

namespace forge {
std::string Tensor::to_string() const { return "tensor(<" + shape_str(shape()) + ">)"; }
std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }
}  // namespace forge
