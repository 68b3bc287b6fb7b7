#include "forge/core/device.h"

#include <optional>

#include "forge/core/error.h"

#ifdef FORGE_WITH_CUDA
// The one call core makes into the CUDA backend: how many GPUs are visible, for "auto"
// (backends/cuda/runtime.cpp; it never throws and needs nothing but the CUDA runtime).
namespace forge::cuda {
int device_count();
}
#endif

namespace forge {

namespace {

// "cuda:N" with N a plain decimal index; nullopt for any other spelling.
std::optional<int> cuda_index(const std::string& s) {
  if (s == "cuda") return 0;
  if (s.rfind("cuda:", 0) != 0 || s.size() == 5 || s.size() > 9) return std::nullopt;
  int i = 0;
  for (size_t k = 5; k < s.size(); ++k) {
    if (s[k] < '0' || s[k] > '9') return std::nullopt;
    i = 10 * i + (s[k] - '0');
  }
  return i;
}

}  // namespace

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (const auto i = cuda_index(s)) return Device::cuda(*i);
  FORGE_THROW("unknown device '", s, "': expected cpu, cuda or cuda:N");
}

Device parse_device(const std::string& spec, int cuda_devices) {
  if (spec == "auto") return cuda_devices > 0 ? Device::cuda(0) : Device::cpu();
  if (spec == "cpu") return Device::cpu();
  const auto i = cuda_index(spec);
  FORGE_CHECK(i.has_value(), "unknown device '", spec, "'; expected cpu, cuda, cuda:N or auto");
  if (*i < cuda_devices) return Device::cuda(*i);
  if (cuda_devices == 0)
    FORGE_THROW(spec, " requested but no CUDA device is visible; use cpu or auto (this machine has no usable GPU, ",
                "or forge was built without CUDA)");
  FORGE_THROW(spec, " requested but ", cuda_devices,
              cuda_devices == 1 ? " CUDA device is visible" : " CUDA devices are visible", "; use cuda:0 .. cuda:",
              cuda_devices - 1, ", cpu or auto");
}

Device parse_device(const std::string& spec) {
#ifdef FORGE_WITH_CUDA
  return parse_device(spec, cuda::device_count());
#else
  return parse_device(spec, 0);
#endif
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(shape[i]);
  }
  return r + "]";
}

}  // namespace forge
