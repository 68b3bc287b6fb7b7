// Note [CPU threading defaults] (threading_defaults.h).
#include "threading_defaults.h"

#include <unistd.h>

#include <cstdlib>

namespace forge::app {

void apply_threading_defaults(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("FORGE_OMP_DEFAULTS") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0 || ::setenv("FORGE_OMP_DEFAULTS", "1", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Not executed again (no /proc): this process goes on with libgomp's own default; its
  // children get the variable.
}

std::string wait_policy_description() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* ours = std::getenv("FORGE_OMP_DEFAULTS");
  if (policy == nullptr) return "libgomp's default (OMP_WAIT_POLICY unset; forge could not set it)";
  if (ours != nullptr && std::string(policy) == "passive")
    return "passive (forge's default: OpenMP workers sleep between regions; OMP_WAIT_POLICY=active to spin)";
  return std::string(policy) + " (OMP_WAIT_POLICY)";
}

std::string thread_binding_description() {
  const char* bind = std::getenv("OMP_PROC_BIND");
  const char* places = std::getenv("OMP_PLACES");
  if (bind == nullptr && places == nullptr)
    return "none (forge's default: threads unbound; OMP_PROC_BIND / OMP_PLACES to bind)";
  std::string s;
  if (bind != nullptr) s += std::string("OMP_PROC_BIND=") + bind;
  if (places != nullptr) s += std::string(s.empty() ? "" : ", ") + "OMP_PLACES=" + places;
  return s + " (the environment's)";
}

}  // namespace forge::app
