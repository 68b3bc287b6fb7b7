#include "forge/ops/index.h"

#include "forge/ops/dispatch_device.h"

namespace forge::ops {
// ---- to be completed ----
Tensor index_select(const Tensor&, int64_t, const Tensor&) { detail::throw_not_on_cuda("index_select (unimplemented)"); }
Tensor gather(const Tensor&, int64_t, const Tensor&) { detail::throw_not_on_cuda("gather (unimplemented)"); }
Tensor scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { detail::throw_not_on_cuda("scatter_add (unimplemented)"); }
}  // namespace forge::ops
