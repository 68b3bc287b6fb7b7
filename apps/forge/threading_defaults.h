#pragma once
// Note [CPU threading defaults]
// -----------------------------
// forge's CPU kernels use OpenMP (libgomp) and its GEMMs OpenBLAS's own pthreads. With libgomp's
// default wait policy, OpenMP's workers spin between parallel regions and take the cores from
// OpenBLAS's threads during GEMMs: on 2 cores `forge train configs/tiny.toml` ran 1.6x slower than
// with OMP_WAIT_POLICY=passive (workers sleep), with the same losses bit for bit. libgomp reads
// the variable when it is loaded, before main(), so when the environment does not set it forge
// sets OMP_WAIT_POLICY=passive and executes itself again, once (FORGE_OMP_DEFAULTS=1 marks the
// second start and tells `forge info` that the policy is forge's choice). A value in the
// environment is always kept. Ranks of `forge launch` inherit the choice.
#include <string>

namespace forge::app {

// First thing in main(): may not return (the program is executed again with the default set).
void apply_threading_defaults(char** argv);

// "passive (forge's default; OMP_WAIT_POLICY chooses)" or "active (OMP_WAIT_POLICY)".
std::string wait_policy_description();

// Thread binding: forge binds nothing itself (binding OpenMP's threads measured 0.76x on 2 cores:
// OpenBLAS's threads then compete with them; docs/environment.md); "none (...)", or the
// environment's OMP_PROC_BIND / OMP_PLACES.
std::string thread_binding_description();

}  // namespace forge::app
