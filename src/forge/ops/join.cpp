#include "forge/ops/join.h"

#include "forge/ops/dispatch_device.h"

namespace forge::ops {
// ---- to be completed ----
Tensor cat(const TensorList&, int64_t) { detail::throw_not_on_cuda("cat (unimplemented)"); }
Tensor stack(const TensorList&, int64_t) { detail::throw_not_on_cuda("stack (unimplemented)"); }
TensorList split(const Tensor&, int64_t, int64_t) { detail::throw_not_on_cuda("split (unimplemented)"); }
TensorList split(const Tensor&, const std::vector<int64_t>&, int64_t) { detail::throw_not_on_cuda("split (unimplemented)"); }
TensorList chunk(const Tensor&, int64_t, int64_t) { detail::throw_not_on_cuda("chunk (unimplemented)"); }
}  // namespace forge::ops
