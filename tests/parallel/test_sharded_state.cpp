// Optimizer state by parameter ranges (parallel/sharded_state.h): shard files round trip, and a
// damaged shard file (issue 43: its names and metadata are untrusted input) is a forge::Error
// naming the file and the field, never std::stoll's exception or a result with unwritten elements.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "forge/forge.h"
#include "forge/parallel/sharded_state.h"
#include "io/io_testing.h"
#include "testing/tensor_testing.h"

namespace forge::parallel {
namespace {

using forge::testing::error_of;
using forge::testing::ScratchDir;

Tensor vec(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}

TEST(ShardedState, ShardFilesRoundTripAndAssembleAnyRange) {
  ScratchDir dir;
  write_optimizer_shard(dir / "a.safetensors", {{"w", 0, 3}}, {{{"exp_avg", vec({1, 2, 3})}}}, {5}, 5);
  write_optimizer_shard(dir / "b.safetensors", {{"w", 3, 5}}, {{{"exp_avg", vec({4, 5})}}}, {5}, 5);
  RangedState s;
  s.add_shard_file(dir / "a.safetensors");
  s.add_shard_file(dir / "b.safetensors");
  EXPECT_EQ(s.get("w", "exp_avg", 1, 5).to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(s.step("w", 0, 5), 5);
  RangedState half;
  half.add_shard_file(dir / "a.safetensors");
  EXPECT_NE(error_of([&] { half.get("w", "exp_avg", 0, 5); }).find("cover 3 of the elements [0, 5)"), std::string::npos);
}

// A shard file written by hand: tensors by name, metadata as given.
void write_raw(const std::filesystem::path& p, const std::vector<std::pair<std::string, Tensor>>& t,
               const io::SafetensorsMetadata& meta) {
  io::save_safetensors(p, t, meta);
}

TEST(ShardedState, DamagedNamesAndCountsAreErrorsNamingTheFile) {
  ScratchDir dir;
  const auto err = [&](const std::string& name, const io::SafetensorsMetadata& meta) {
    const auto p = dir / "shard.safetensors";
    write_raw(p, {{name, vec({1, 2})}}, meta);
    RangedState s;
    return error_of([&] { s.add_shard_file(p); });
  };
  for (const char* lo : {"x", "-3", "", "99999999999999999999", "1e3", "4 "}) {
    const std::string e = err(std::string("exp_avg|w|") + lo, {});
    EXPECT_NE(e.find("shard.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("is not a count"), std::string::npos) << lo << ": " << e;
  }
  for (const char* step : {"abc", "-5", "1e99", "184467440737095516160"}) {
    const std::string e = err("exp_avg|w|0", {{"step|w|0", step}});
    EXPECT_NE(e.find("the update count of w|0"), std::string::npos) << step << ": " << e;
  }
  EXPECT_NE(err("exp_avg_no_bars", {}).find("is not <state>|<param>|<lo>"), std::string::npos);
}

TEST(ShardedState, OverlappingRangesAreRefused) {
  ScratchDir dir;
  // [0, 3) and [2, 4): together 5 elements "cover" [0, 5) by count, with element 4 never written.
  write_raw(dir / "a.safetensors", {{"exp_avg|w|0", vec({1, 2, 3})}}, {});
  write_raw(dir / "b.safetensors", {{"exp_avg|w|2", vec({7, 8})}}, {});
  RangedState s;
  s.add_shard_file(dir / "a.safetensors");
  const std::string e = error_of([&] { s.add_shard_file(dir / "b.safetensors"); });
  EXPECT_NE(e.find("the ranges [0, 3) and [2, 4) of 'w' overlap"), std::string::npos) << e;
}

TEST(ShardedState, AFullStateWithABadSlotIsAnError) {
  RangedState s;
  const io::NamedTensors t({{"state.x.exp_avg", vec({1})}});
  EXPECT_NE(error_of([&] { s.add_full_state(t, {}, {"w"}); }).find("the slot of tensor 'state.x.exp_avg'"),
            std::string::npos);
  const io::NamedTensors nodot({{"state.0", vec({1})}});
  EXPECT_NE(error_of([&] { s.add_full_state(nodot, {}, {"w"}); }).find("is not state.<slot>.<name>"), std::string::npos);
  const io::NamedTensors ok({{"state.0.exp_avg", vec({1})}});
  EXPECT_NE(error_of([&] { s.add_full_state(ok, {{"state.0.step", 1e300}}, {"w"}); }).find("is not a count"),
            std::string::npos);
  EXPECT_NE(error_of([&] { s.add_full_state(ok, {{"state.0.step", std::nan("")}}, {"w"}); }).find("is not a count"),
            std::string::npos);
  s.add_full_state(ok, {{"state.0.step", 3}}, {"w"});
  EXPECT_EQ(s.step("w", 0, 1), 3);
}

}  // namespace
}  // namespace forge::parallel
