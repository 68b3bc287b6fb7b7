// The CUDA runtime glue: device discovery, errors (Note [CUDA errors] in runtime.h), the
// device guard and synchronisation. Host code only; no kernels, no device memory.
//
// device_count() never throws: a machine without a driver or without a GPU has 0 CUDA
// devices, so a CUDA-enabled build runs its CPU work (and skips its GPU tests) there.
#include "forge/backends/cuda/runtime.h"

#include <mutex>
#include <sstream>
#include <vector>

#include "forge/backends/cuda/tensor_kernels.h"

namespace forge::cuda {

namespace detail {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear the error so a later, unrelated launch check does not report it again
  // (sticky errors, after a kernel fault, cannot be cleared and keep failing every call).
  (void)cudaGetLastError();
  FORGE_THROW("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr, " at ", file, ":",
              line);
}

void throw_launch_error(cudaError_t err, const std::string& what, const char* file, int line) {
  FORGE_THROW("CUDA kernel launch failed for ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
              ") at ", file, ":", line);
}

}  // namespace detail

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver / no device / driver too old: not an error for us
      return 0;
    }
    return n;
  }();
  return count;
}

void check_device(int device, const char* op) {
  const int n = device_count();
  FORGE_CHECK(device >= 0 && device < n, op, ": CUDA device ", device, " is not available (", n,
              " CUDA device(s) visible)");
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  FORGE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) FORGE_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  // Never throws (destructors run during unwinding); a failure here leaves the device set.
  if (previous_ != device_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

int multiprocessor_count(int device) {
  static std::once_flag once;
  static std::vector<int> counts;
  std::call_once(once, [] {
    counts.assign(static_cast<size_t>(device_count()), 0);
    for (int d = 0; d < static_cast<int>(counts.size()); ++d)
      FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&counts[static_cast<size_t>(d)], cudaDevAttrMultiProcessorCount, d));
  });
  check_device(device, "multiprocessor_count");
  return counts[static_cast<size_t>(device)];
}

std::string describe_operands(const char* op, const Tensor* const* ops, int n) {
  std::ostringstream os;
  os << op << " on " << (n > 0 ? ops[0]->device().str() : std::string("?")) << ":";
  for (int k = 0; k < n; ++k) {
    const Tensor& t = *ops[k];
    os << (k == 0 ? " out " : "; in") ;
    if (k > 0) os << k << " ";
    os << shape_str(t.shape()) << " " << dtype_name(t.dtype()) << " strides " << shape_str(t.strides());
    if (t.device() != ops[0]->device()) os << " on " << t.device().str();
  }
  return os.str();
}

void synchronize(int device) {
  check_device(device, "synchronize");
  DeviceGuard guard(device);
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace forge::cuda
