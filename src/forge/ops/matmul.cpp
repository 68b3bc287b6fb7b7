#include "forge/ops/matmul.h"

#include "forge/ops/dispatch_device.h"

namespace forge::ops {
// ---- to be completed ----
Tensor matmul(const Tensor&, const Tensor&) { detail::throw_not_on_cuda("matmul (unimplemented)"); }
Tensor mm(const Tensor&, const Tensor&) { detail::throw_not_on_cuda("mm (unimplemented)"); }
Tensor bmm(const Tensor&, const Tensor&) { detail::throw_not_on_cuda("bmm (unimplemented)"); }
}  // namespace forge::ops
