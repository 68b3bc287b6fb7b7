// Out of memory in forge train (Note [memory owners], train/oom_report.h): a CPU run held to a
// memory limit (FORGE_CPU_MEMORY_LIMIT, the CPU allocator's stand-in for a full GPU) with an
// oversized batch stops with an error that names the failed allocation's owner and the snapshot
// file; the snapshot holds the live bytes by owner (forward blocks, parameters, ...), the
// allocator's figures and forge plan's prediction for the run's config, which says the run does
// not fit the limit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/env.h"
#include "forge/core/memory_owner.h"
#include "testing/cli_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

TEST(OomReport, AnOversizedBatchLeavesASnapshotBesideThePlan) {
  train_testing::Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const fs::path cfg = scratch.path() / "oom.toml";
  std::ofstream(cfg) << train_testing::tiny_toml(scratch.path(), "oom", 3);
  // 40 MB: the model and optimizer need well under 1 MB, batch 1024 x 32 of activations far more.
  const auto r = testing::run_forge({"train", cfg.string(), "--train.batch_size=1024", "--eval.every=0"},
                                    testing::Stderr::merged, {{"FORGE_CPU_MEMORY_LIMIT", "40MB"}});
  ASSERT_NE(r.status, 0) << r.out;
  const fs::path snap = scratch.path() / "runs" / "oom" / "oom_snapshot.rank0.json";
  for (const std::string& part : std::vector<std::string>{"out of memory", "FORGE_CPU_MEMORY_LIMIT", "for forward: block", snap.string()})
    EXPECT_NE(r.out.find(part), std::string::npos) << "missing '" << part << "' in:\n" << r.out;
  ASSERT_TRUE(fs::exists(snap)) << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(snap));
  EXPECT_NE(j["failed_owner"].get<std::string>().find("forward: block"), std::string::npos) << j.dump(2);
  EXPECT_GT(j["requested_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["allocator"]["limit_bytes"].get<int64_t>(), 40'000'000);
  // Live bytes by owner: the blocks' activations lead, the parameters are there, and the sum is
  // what the allocator holds.
  int64_t sum = 0;
  bool params = false;
  for (const auto& o : j["live_by_owner"]) {
    sum += o["bytes"].get<int64_t>();
    params = params || o["owner"] == "parameters";
  }
  EXPECT_TRUE(params) << j["live_by_owner"].dump(2);
  EXPECT_EQ(sum, j["allocator"]["allocated_bytes"].get<int64_t>());
  const std::string top = j["live_by_owner"][0]["owner"];
  EXPECT_TRUE(top.rfind("forward: ", 0) == 0) << j["live_by_owner"].dump(2);
  // forge plan's prediction for the same config: batch 1024 on one CPU, more than the limit.
  ASSERT_TRUE(j.contains("plan")) << j.dump(2);
  EXPECT_NE(j["plan"]["command"].get<std::string>().find("forge plan --config"), std::string::npos);
  EXPECT_NE(j["plan"]["layout"].get<std::string>().find("micro-batch 1024"), std::string::npos) << j["plan"].dump(2);
  EXPECT_GT(j["plan"]["memory_per_gpu_bytes"]["activations"].get<double>(), 40e6) << j["plan"].dump(2);
  EXPECT_GT(j["plan"]["memory_per_gpu_bytes"]["params"].get<double>(), 0);
  // The command it names says the same.
  const auto p = testing::run_forge({"plan", "--config", (scratch.path() / "runs" / "oom" / "config.toml").string(),
                                     "--gpu", "cpu", "--json"},
                                    testing::Stderr::dropped);
  ASSERT_EQ(p.status, 0) << p.out;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_NEAR(pj["memory"]["total"].get<double>(), j["plan"]["memory_per_gpu_bytes"]["total"].get<double>(), 1.0)
      << pj["memory"].dump(2);
}

TEST(OomReport, ABadLimitIsRefusedNamingTheVariable) {
  const auto r = testing::run_forge({"info"}, testing::Stderr::merged, {{"FORGE_CPU_MEMORY_LIMIT", "lots"}});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("FORGE_CPU_MEMORY_LIMIT = 'lots' is not a size"), std::string::npos) << r.out;
  // The GPU's limit is parsed the same way (read by the CUDA allocator; tested on a GPU in
  // CudaAllocator.AMemoryLimitFailsARunAsAFullSmallerGpuWould).
  EXPECT_EQ(parse_memory_limit("FORGE_CUDA_MEMORY_LIMIT"), std::nullopt);
  {
    const env::Override o("FORGE_CUDA_MEMORY_LIMIT", "40GiB");
    EXPECT_EQ(parse_memory_limit("FORGE_CUDA_MEMORY_LIMIT"), int64_t{40} << 30);
  }
  {
    const env::Override o("FORGE_CUDA_MEMORY_LIMIT", "1.5 GB");
    try {
      (void)parse_memory_limit("FORGE_CUDA_MEMORY_LIMIT");
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FORGE_CUDA_MEMORY_LIMIT = '1.5 GB' is not a size"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace forge::train
