#include "forge/core/device.h"

#include <cstdlib>

#include "forge/core/error.h"

namespace forge {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    const std::string num = s.substr(5);
    char* end = nullptr;
    long i = std::strtol(num.c_str(), &end, 10);
    if (end && *end == '\0' && i >= 0 && i < 1024) return Device::cuda(static_cast<int>(i));
  }
  FORGE_THROW("unknown device '", s, "': expected cpu, cuda or cuda:N");
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
