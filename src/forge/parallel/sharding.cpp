// Sharding: the ZeRO stages as what they shard (sharding.h).
#include "forge/parallel/sharding.h"

#include "forge/core/error.h"

namespace forge::parallel {

Sharding Sharding::from_stage(long long stage, const std::string& what) {
  FORGE_CHECK(stage >= 0 && stage <= 3, what, " = ", stage,
              ": use 0 (DDP), 1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters)");
  return Sharding(static_cast<int>(stage));
}

std::string Sharding::name() const { return stage_ == 0 ? std::string("DDP") : "ZeRO-" + std::to_string(stage_); }

}  // namespace forge::parallel
