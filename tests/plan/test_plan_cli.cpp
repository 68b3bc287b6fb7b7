// `forge plan` end to end: runs the binary built next to this test (<build>/forge) and checks
// its JSON, its tables and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/cli_testing.h"

namespace forge::plan {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_forge;
using testing::Stderr;

nlohmann::json json_of(const std::vector<std::string>& args) {
  const CliRun r = run_forge(args, Stderr::dropped);
  EXPECT_EQ(r.status, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

using PlanCli = testing::ForgeCliTest;

TEST_F(PlanCli, PlanAsJson) {
  const auto j = json_of({"plan", "llama2-7b", "--tokens", "2T", "--gpu", "h100", "--gpus", "8", "--micro-batch", "1",
                          "--zero", "1", "--json"});
  EXPECT_EQ(j["parameters"]["total"], 6738415616);
  EXPECT_EQ(j["hardware"]["gpu"], "H100 SXM");
  EXPECT_EQ(j["layout"]["dp"], 8);
  EXPECT_EQ(j["layout"]["grad_accum"], 128);  // the preset's batch of 1024 sequences
  EXPECT_DOUBLE_EQ(j["flops"]["tokens"].get<double>(), 2e12);
  EXPECT_TRUE(j["memory"]["fits"].get<bool>());
  EXPECT_GT(j["time"]["gpu_hours"].get<double>(), 0);
  EXPECT_GT(j["cost"]["rent"]["total"].get<double>(), 0);
}

// --grad-compression: priced (Note [compressed reductions in the plan]), carried to the layout and
// to the forge train command; an unknown value is refused naming it.
TEST_F(PlanCli, GradCompressionIsPricedAndCarriedToTheCommand) {
  const std::vector<std::string> base = {"plan", "gpt2", "--gpu", "h100", "--gpus", "4", "--gpus-per-node", "2",
                                         "--ib", "1.25", "--micro-batch", "16", "--tokens", "1B", "--json"};
  auto with = [&](const std::string& gc) {
    auto a = base;
    a.insert(a.end(), {"--grad-compression", gc});
    return json_of(a);
  };
  const auto none = with("none"), fp8 = with("fp8"), psgd = with("powersgd");
  EXPECT_EQ(fp8["layout"]["grad_compression"], "fp8");
  EXPECT_LT(fp8["time"]["dp_comm"].get<double>(), 0.6 * none["time"]["dp_comm"].get<double>());
  EXPECT_LT(psgd["time"]["dp_comm"].get<double>(), 0.1 * none["time"]["dp_comm"].get<double>());
  auto a = base;
  a.pop_back();  // the search's table and its best layout's command
  a.insert(a.end(), {"--grad-compression", "fp8", "--search"});
  const CliRun t = run_forge(a, Stderr::dropped);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("--dist.grad_compression=fp8"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("gradients reduced in FP8 (--grad-compression)"), std::string::npos) << t.out;
  const CliRun bad = run_forge({"plan", "gpt2", "--gpus", "4", "--grad-compression", "zip"}, Stderr::merged);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--grad-compression 'zip' is unknown; use none, fp8 or powersgd"), std::string::npos) << bad.out;
}

TEST_F(PlanCli, SearchAsJsonAndAsATable) {
  const auto j = json_of({"plan", "gpt2", "--tokens", "10B", "--gpu", "rtx4090", "--gpus", "4", "--search", "--json"});
  ASSERT_FALSE(j["fits"].empty());
  EXPECT_EQ(j["gpus"], 4);
  const CliRun t = run_forge({"plan", "gpt2", "--tokens", "10B", "--gpu", "rtx4090", "--gpus", "4", "--search"});
  EXPECT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("fastest layouts that fit"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("best: "), std::string::npos) << t.out;
}

TEST_F(PlanCli, SummaryListsModulesWithTotals) {
  const CliRun r = run_forge({"plan", "gpt2", "--summary"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("transformer.h.0.attn.c_attn"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("124,439,808"), std::string::npos) << r.out;
  const auto j = json_of({"plan", "llama2-7b", "--summary", "--json"});
  EXPECT_EQ(j["total_params"], 6738415616);
}

TEST_F(PlanCli, ReadsAForgeConfigWithOverrides) {
  const fs::path dir = fs::temp_directory_path() / ("forge_plan_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path cfg = dir / "tiny.toml";
  {
    std::ofstream f(cfg);
    f << "[model]\ntype = \"gpt\"\nvocab_size = 1024\nblock_size = 64\nn_layer = 4\nn_head = 4\nn_embd = 128\n"
      << "[data]\nfiles = [\"" << cfg.string() << "\"]\n"
      << "[train]\nsteps = 10\nbatch_size = 8\nseq_len = 64\n";
  }
  auto j = json_of({"plan", "--config", cfg.string(), "--gpu", "cpu", "--peak-tflops", "0.1", "--json"});
  EXPECT_EQ(j["parameters"]["total"], 932608);  // configs/tiny.toml's model
  EXPECT_EQ(j["layout"]["micro_batch"], 8);
  EXPECT_DOUBLE_EQ(j["flops"]["tokens"].get<double>(), 10.0 * 8 * 64);  // the config's run
  EXPECT_EQ(j["training"]["activation_model"], "forge");
  EXPECT_EQ(j["training"]["precision"], "fp32");
  j = json_of({"plan", "--config", cfg.string(), "--model.n_layer=2", "--gpu", "cpu", "--peak-tflops", "0.1", "--json"});
  EXPECT_EQ(j["model"]["n_layer"], 2);
  // The config's layout keys are the plan's defaults (one layout type, parallel::Layout), and
  // train.batch_size is the global batch: 2 micro-batches of 4 on one GPU, or of 2 on each of two.
  j = json_of({"plan", "--config", cfg.string(), "--dist.zero_stage=2", "--dist.offload_optimizer=true",
               "--train.grad_accum=2", "--gpu", "cpu", "--peak-tflops", "0.1", "--json"});
  EXPECT_EQ(j["layout"]["zero"], 2);
  EXPECT_EQ(j["layout"]["offload"], true);
  EXPECT_EQ(j["layout"]["micro_batch"], 4);
  EXPECT_EQ(j["layout"]["grad_accum"], 2);
  EXPECT_DOUBLE_EQ(j["flops"]["tokens"].get<double>(), 10.0 * 8 * 64);
  j = json_of({"plan", "--config", cfg.string(), "--train.grad_accum=2", "--gpus", "2", "--gpu", "h100", "--json"});
  EXPECT_EQ(j["layout"]["dp"], 2);
  EXPECT_EQ(j["layout"]["micro_batch"], 2);
  EXPECT_EQ(j["layout"]["grad_accum"], 2);
  // Sequence parallelism and the pipeline schedule too: the config's (sp off, zb-h1) unless the
  // flags say otherwise (the first version planned sp and 1F1B whatever the config said).
  j = json_of({"plan", "--config", cfg.string(), "--dist.tp=2", "--dist.sequence_parallel=false", "--dist.pp=2",
               "--dist.pp_schedule=zb-h1", "--gpu", "h100", "--json"});
  EXPECT_EQ(j["layout"]["sequence_parallel"], false);
  EXPECT_EQ(j["layout"]["schedule"], "zb-h1");
  j = json_of({"plan", "--config", cfg.string(), "--dist.tp=2", "--dist.sequence_parallel=false", "--sp",
               "--dist.pp=2", "--dist.pp_schedule=zb-h1", "--schedule", "gpipe", "--gpu", "h100", "--json"});
  EXPECT_EQ(j["layout"]["sequence_parallel"], true);
  EXPECT_EQ(j["layout"]["schedule"], "gpipe");
  fs::remove_all(dir);
}

// A config written for fewer GPUs: its batch does not split over --gpus 8, so its micro-batch per
// GPU is kept and the global batch scaled, and the message says how to train it; "auto" with
// --gpus > 1 plans GPUs (an H100 unless --gpu says otherwise).
TEST_F(PlanCli, AConfigIsScaledToMoreGpusAndSaysHow) {
  const fs::path cfg = fs::path(FORGE_SOURCE_DIR) / "configs" / "llama-0.85b.toml";
  const CliRun r = run_forge({"plan", "--config", cfg.string(), "--gpus", "8"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("forge plan: no --gpu: planning on an H100 SXM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the config's batch of 4 sequences does not split over dp = 8 GPUs; planning 32 (its 4 per GPU "
                       "x 8): train it with --train.batch_size=32, or give --batch"),
            std::string::npos)
      << r.out;
  const auto j = json_of({"plan", "--config", cfg.string(), "--gpus", "8", "--json"});
  EXPECT_EQ(j["layout"]["dp"], 8);
  EXPECT_EQ(j["layout"]["micro_batch"], 4);
  EXPECT_EQ(j["layout"]["grad_accum"], 1);
  // A batch the user gives is never changed: the error names the fix.
  const CliRun given = run_forge({"plan", "--config", cfg.string(), "--gpus", "8", "--batch", "12"});
  EXPECT_EQ(given.status, 1) << given.out;
  EXPECT_NE(given.out.find("give --batch as a multiple of"), std::string::npos) << given.out;
}

// A layout that does not fit points to --search.
TEST_F(PlanCli, ALayoutThatDoesNotFitSuggestsSearch) {
  const CliRun r = run_forge({"plan", "llama2-7b", "--gpu", "h100", "--gpus", "1"}, Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("This layout does not fit. The same command with --search lists the layouts of 1 GPU(s) that fit"),
            std::string::npos)
      << r.out;
  const CliRun fits = run_forge({"plan", "gpt2", "--gpu", "h100", "--gpus", "1"}, Stderr::dropped);
  ASSERT_EQ(fits.status, 0) << fits.out;
  EXPECT_EQ(fits.out.find("--search lists"), std::string::npos) << fits.out;
}

TEST_F(PlanCli, BadInputIsAClearError) {
  CliRun r = run_forge({"plan", "llama2-7b", "--gpu", "h1000"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("forge: error: unknown GPU 'h1000'; did you mean 'h100'"), std::string::npos) << r.out;
  r = run_forge({"plan", "llama2-8b"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("did you mean"), std::string::npos) << r.out;
  r = run_forge({"plan", "gpt2", "--gpus", "5", "--tp", "5"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("heads = 12 are not divisible by tp = 5"), std::string::npos) << r.out;
  r = run_forge({"plan", "gpt2", "--pp", "16", "--gpus", "16"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("layers = 12 cannot fill pp = 16"), std::string::npos) << r.out;
  r = run_forge({"plan", "gpt2", "--gpus", "8", "--micro-batch", "3"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("not divisible by micro-batch x dp = 3 x 8 = 24"), std::string::npos) << r.out;
  r = run_forge({"plan", "gpt2", "--no-such-flag"});
  EXPECT_EQ(r.status, 2) << r.out;
}

// Note [efficiency profiles]: a GPU plan prices each kernel from the GPU's shipped profile by
// default; --mfu (or --profile none) plans at one utilisation; --profile FILE reads forge bench
// calibrate's JSON, which must describe the GPU planned.
TEST_F(PlanCli, TheDefaultIsTheGpusEfficiencyProfile) {
  const auto p = json_of({"plan", "gpt2", "--gpu", "h100", "--batch", "16", "--tokens", "1B", "--json"});
  EXPECT_EQ(p["training"]["efficiency"]["model"], "profile");
  EXPECT_EQ(p["training"]["efficiency"]["profile"], "H100 SXM");
  EXPECT_GT(p["time"]["gemm"].get<double>(), 0);
  const auto m = json_of({"plan", "gpt2", "--gpu", "h100", "--batch", "16", "--tokens", "1B", "--mfu", "0.4", "--json"});
  EXPECT_EQ(m["training"]["efficiency"]["model"], "mfu");
  EXPECT_EQ(m["time"]["gemm"].get<double>(), 0);
  const auto n = json_of({"plan", "gpt2", "--gpu", "h100", "--batch", "16", "--tokens", "1B", "--profile", "none", "--json"});
  EXPECT_DOUBLE_EQ(n["time"]["step"].get<double>(), m["time"]["step"].get<double>());
  // A profile file: the shipped A100's, written out, read back for the A100; refused for the H100.
  const auto gpus = json_of({"plan", "--list-gpus", "--json"});
  nlohmann::json a100;
  for (const auto& g : gpus["gpus"])
    if (g["name"] == "A100 SXM 80GB") a100 = g["profile"];
  ASSERT_TRUE(a100.is_object());
  const fs::path file = fs::temp_directory_path() / ("forge_profile_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << a100.dump();
  const auto f = json_of({"plan", "gpt2", "--gpu", "a100-80gb", "--batch", "16", "--tokens", "1B", "--profile",
                          file.string(), "--json"});
  const auto d = json_of({"plan", "gpt2", "--gpu", "a100-80gb", "--batch", "16", "--tokens", "1B", "--json"});
  EXPECT_DOUBLE_EQ(f["time"]["step"].get<double>(), d["time"]["step"].get<double>());
  const CliRun wrong = run_forge({"plan", "gpt2", "--gpu", "h100", "--profile", file.string()});
  EXPECT_NE(wrong.status, 0);
  EXPECT_NE(wrong.out.find("A100 SXM 80GB"), std::string::npos) << wrong.out;
  std::ofstream(file) << "{\"gpu\": \"H100 SXM\"}";
  const CliRun bad = run_forge({"plan", "gpt2", "--gpu", "h100", "--profile", file.string()});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("sms"), std::string::npos) << bad.out;
  fs::remove(file);
  const CliRun cpu = run_forge({"bench", "calibrate", "--device", "cpu", "--out", file.string()});
  EXPECT_NE(cpu.status, 0);
  EXPECT_NE(cpu.out.find("describe GPUs"), std::string::npos) << cpu.out;
  EXPECT_FALSE(fs::exists(file));
}

}  // namespace
}  // namespace forge::plan
