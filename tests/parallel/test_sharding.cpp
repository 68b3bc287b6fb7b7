// Sharding (parallel/sharding.h): each ZeRO stage answers what it shards, the config's number maps
// onto it, and a number out of range is an error that names the key and the choices.
#include <gtest/gtest.h>

#include <string>

#include "forge/core/error.h"
#include "forge/parallel/layout.h"
#include "forge/parallel/sharding.h"

namespace forge::parallel {
namespace {

TEST(Sharding, EachStageShardsWhatZeroSays) {
  struct Row {
    Sharding s;
    bool optimizer, gradients, parameters;
    const char* name;
  };
  const Row rows[] = {{Sharding::ddp(), false, false, false, "DDP"},
                      {Sharding::zero1(), true, false, false, "ZeRO-1"},
                      {Sharding::zero2(), true, true, false, "ZeRO-2"},
                      {Sharding::zero3(), true, true, true, "ZeRO-3"}};
  for (int stage = 0; stage < 4; ++stage) {
    const Row& r = rows[stage];
    EXPECT_EQ(Sharding::from_stage(stage), r.s);
    EXPECT_EQ(r.s.stage(), stage);
    EXPECT_EQ(r.s.optimizer_state(), r.optimizer) << r.name;
    EXPECT_EQ(r.s.gradients(), r.gradients) << r.name;
    EXPECT_EQ(r.s.parameters(), r.parameters) << r.name;
    EXPECT_EQ(r.s.name(), r.name);
    Layout l;
    l.zero = stage;
    EXPECT_EQ(l.sharding(), r.s);
  }
  EXPECT_EQ(Sharding(), Sharding::ddp());
}

TEST(Sharding, AStageOutOfRangeNamesTheKeyAndTheChoices) {
  for (long long bad : {-1LL, 4LL, 100LL}) {
    try {
      (void)Sharding::from_stage(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("dist.zero_stage = " + std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("0 (DDP)"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace forge::parallel
