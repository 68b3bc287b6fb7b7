// forge::io checkpoints (src/forge/io/checkpoint.h): tensors, RNG streams and JSON state come
// back exactly; a failed save keeps the previous checkpoint; find_latest_checkpoint skips the
// temporaries of an interrupted save; check_compatible names the tensor and both shapes.
#include <gtest/gtest.h>

#include "io/io_testing.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

using io::CheckpointData;
using nlohmann::json;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

CheckpointData sample_checkpoint(int64_t step) {
  CheckpointData d;
  d.step = step;
  d.model = io::NamedTensors{{"wte.weight", random_bits(DType::bf16, {16, 8}, 1)},
                             {"h.0.ln_1.weight", random_bits(DType::f32, {8}, 2)},
                             {"h.0.attn.c_attn.weight", random_bits(DType::bf16, {8, 24}, 3).t()},  // a view
                             {"lm_head.bias", random_bits(DType::f32, {0}, 4)}};
  d.optimizer = io::NamedTensors{{"step", scalar_tensor(static_cast<double>(step), {.dtype = DType::i64})},
                                 {"exp_avg.wte.weight", random_bits(DType::f32, {16, 8}, 5)},
                                 {"exp_avg_sq.wte.weight", random_bits(DType::f32, {16, 8}, 6)},
                                 {"master.wte.weight", random_bits(DType::f64, {16, 8}, 7)}};
  d.data_loader = json{{"shard", 3}, {"offset", 123456789012LL}, {"epoch", 1}, {"order", {4, 1, 3}}};
  d.config = json{{"model", {{"n_layer", 12}, {"n_embd", 768}}}, {"train", {{"lr", 6e-4}, {"steps", 5000}}}};
  d.extra = json{{"loss_scale", 65536.0}, {"best_val_loss", 3.25}};
  return d;
}

void expect_same_tensors(const io::NamedTensors& got, const io::NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  auto it = got.begin();
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    EXPECT_EQ(it->first, name);
    EXPECT_EQ(it->second.dtype(), t.dtype());
    EXPECT_EQ(it->second.shape(), t.shape());
    EXPECT_EQ(bytes_of(it->second), bytes_of(t));
    ++it;
  }
}

TEST(Checkpoint, RoundTripsTensorsAndState) {
  ScratchDir dir;
  CheckpointData d = sample_checkpoint(1200);
  d.rng = {12345, 678};
  d.generators["dropout"] = {99, 1ULL << 40};
  d.generators["shuffle"] = {~0ULL, 3};  // the full u64 range survives JSON
  const fs::path ck = dir / "ck";
  io::save_checkpoint(ck, d);
  EXPECT_EQ(listing(ck), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));

  const CheckpointData r = io::load_checkpoint(ck);
  EXPECT_EQ(r.step, 1200);
  expect_same_tensors(r.model, d.model);
  expect_same_tensors(r.optimizer, d.optimizer);
  EXPECT_EQ(r.rng, d.rng);
  EXPECT_EQ(r.generators, d.generators);
  EXPECT_EQ(r.data_loader, d.data_loader);
  EXPECT_EQ(r.config, d.config);
  EXPECT_EQ(r.extra, d.extra);
  EXPECT_EQ(r.forge_version, FORGE_VERSION);
  EXPECT_EQ(r.format_version, io::kCheckpointFormatVersion);

  // state.json is plain, documented JSON.
  const json state = json::parse(slurp(ck / "state.json"));
  EXPECT_EQ(state["format"], "forge-checkpoint");
  EXPECT_EQ(state["format_version"], 1);
  EXPECT_EQ(state["step"], 1200);
  EXPECT_EQ(state["rng"]["default"]["seed"], 12345u);
  EXPECT_EQ(state["rng"]["generators"]["dropout"]["offset"], 1ULL << 40);
  // The model file is an ordinary safetensors file with the HF-style metadata.
  const auto model = io::load_safetensors(ck / "model.safetensors");
  EXPECT_EQ(model.metadata.at("format"), "pt");
  EXPECT_EQ(model.metadata.at("forge_step"), "1200");
}

TEST(Checkpoint, ConfigAsTextAndEmptyState) {
  ScratchDir dir;
  CheckpointData d;
  d.config = "[model]\nn_layer = 2\n";  // the TOML text, stored as a JSON string
  io::save_checkpoint(dir / "ck", d);
  const CheckpointData r = io::load_checkpoint(dir / "ck");
  EXPECT_EQ(r.step, 0);
  EXPECT_TRUE(r.model.empty());
  EXPECT_TRUE(r.optimizer.empty());
  EXPECT_TRUE(r.config.is_string());
  EXPECT_EQ(r.config.get<std::string>(), "[model]\nn_layer = 2\n");
  EXPECT_TRUE(r.data_loader.is_null());
  EXPECT_TRUE(r.generators.empty());
}

TEST(Checkpoint, RestoredRngDrawsTheSameNextNumbers) {
  ScratchDir dir;
  Generator dropout(2024);
  manual_seed(7);
  (void)randn({37});  // advance both streams to the middle of a run
  (void)rand({5}, {}, &dropout);

  CheckpointData d;
  d.step = 10;
  io::capture_rng(d, {{"dropout", &dropout}});
  io::save_checkpoint(dir / "ck", d);

  // What the run would have drawn next.
  const Tensor next_default = randn({64}, {.dtype = DType::f64});
  const Tensor next_dropout = rand({64}, {}, &dropout);
  const Tensor next_int = randint(0, 1000, {16});

  // Something else happens to both generators (a different run, or a fresh process).
  manual_seed(31337);
  (void)randn({1000});
  dropout.manual_seed(1);

  const CheckpointData r = io::load_checkpoint(dir / "ck");
  io::restore_rng(r, {{"dropout", &dropout}});
  EXPECT_EQ(bytes_of(randn({64}, {.dtype = DType::f64})), bytes_of(next_default));
  EXPECT_EQ(bytes_of(rand({64}, {}, &dropout)), bytes_of(next_dropout));
  EXPECT_EQ(bytes_of(randint(0, 1000, {16})), bytes_of(next_int));

  Generator unknown;
  EXPECT_HAS(error_of([&] { io::restore_rng(r, {{"augment", &unknown}}); }), "no state for generator 'augment'");
}

TEST(Checkpoint, LoadsOntoTheRequestedDevice) {
  ScratchDir dir;
  CheckpointData d = sample_checkpoint(1);
  io::save_checkpoint(dir / "ck", d);
  const CheckpointData r = io::load_checkpoint(dir / "ck", Device::cpu());
  for (const auto& [name, t] : r.model) EXPECT_TRUE(t.is_cpu()) << name;
  if (cuda_device_count() == 0) {
    // Without a GPU the request is refused with forge's usual error, not a crash.
    EXPECT_THROW(io::load_checkpoint(dir / "ck", Device::cuda(0)), Error);
  } else {
    const CheckpointData g = io::load_checkpoint(dir / "ck", Device::cuda(0));
    for (const auto& [name, t] : g.model) EXPECT_TRUE(t.is_cuda()) << name;
    expect_same_tensors(g.model, d.model);
  }
}

TEST(Checkpoint, FailedSaveKeepsThePreviousCheckpoint) {
  ScratchDir dir;
  const fs::path ck = dir / "ck";
  const CheckpointData first = sample_checkpoint(100);
  io::save_checkpoint(ck, first);

  // The second save dies after model.safetensors, while writing the optimizer file.
  CheckpointData second = sample_checkpoint(200);
  second.optimizer.insert("broken", Tensor());
  const std::string e = error_of([&] { io::save_checkpoint(ck, second); });
  EXPECT_HAS(e, ck.string());
  EXPECT_HAS(e, "tensor 'broken' is undefined");

  const CheckpointData r = io::load_checkpoint(ck);
  EXPECT_EQ(r.step, 100);
  expect_same_tensors(r.model, first.model);
  expect_same_tensors(r.optimizer, first.optimizer);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"ck"});

  // A good save then replaces it whole.
  io::save_checkpoint(ck, sample_checkpoint(300));
  EXPECT_EQ(io::load_checkpoint(ck).step, 300);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"ck"});
}

TEST(Checkpoint, FindLatestIgnoresHalfWrittenTemporaries) {
  ScratchDir run;
  EXPECT_FALSE(io::find_latest_checkpoint(run.path()).has_value());
  EXPECT_EQ(io::checkpoint_path(run.path(), 123), run.path() / "checkpoints" / "step_00000123");

  for (int64_t step : {9, 10, 100}) io::save_checkpoint(io::checkpoint_path(run.path(), step), sample_checkpoint(step));
  // An interrupted save of step 200 (killed while filling its temporary directory) ...
  const fs::path half = run.path() / "checkpoints" / "step_00000200.tmp.999.0123456789abcdef";
  fs::create_directories(half);
  spit(half / "model.safetensors", "partial");
  // ... a complete-looking temporary, and directories that are not checkpoints.
  io::save_checkpoint(run.path() / "checkpoints" / "step_00000300.old.5.00000000000000aa", sample_checkpoint(300));
  fs::create_directories(run.path() / "checkpoints" / "step_00000400");  // empty: not a checkpoint
  fs::create_directories(run.path() / "checkpoints" / "step_x500");
  spit(run.path() / "checkpoints" / "step_00000600", "a file");

  const auto latest = io::find_latest_checkpoint(run.path());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, io::checkpoint_path(run.path(), 100));
  EXPECT_EQ(io::load_checkpoint(*latest).step, 100);

  const auto all = io::list_checkpoints(run.path());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].first, 9);
  EXPECT_EQ(all[1].first, 10);
  EXPECT_EQ(all[2].first, 100);

  // A step past 8 digits still sorts by number.
  io::save_checkpoint(io::checkpoint_path(run.path(), 123456789), sample_checkpoint(123456789));
  EXPECT_EQ(*io::find_latest_checkpoint(run.path()), run.path() / "checkpoints" / "step_123456789");

  io::prune_checkpoints(run.path(), 2);
  const auto kept = io::list_checkpoints(run.path());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].first, 100);
  EXPECT_EQ(kept[1].first, 123456789);
  EXPECT_FALSE(fs::exists(half));  // the temporaries went too
  EXPECT_FALSE(fs::exists(run.path() / "checkpoints" / "step_00000300.old.5.00000000000000aa"));
}

TEST(Checkpoint, CompatibilityErrorsNameTheTensorAndBothShapes) {
  const io::NamedTensors loaded{{"wte.weight", zeros({50304, 768})}, {"h.0.attn.weight", zeros({768, 2304})},
                                {"ln_f.weight", zeros({768})}};
  io::NamedShapes expected{{"wte.weight", {50304, 768}}, {"h.0.attn.weight", {768, 2304}}, {"ln_f.weight", {768}}};
  EXPECT_NO_THROW(io::check_compatible(expected, loaded));
  EXPECT_NO_THROW(io::check_compatible(io::named_shapes(loaded), loaded));

  expected[1].second = {1024, 3072};
  expected[2].second = {1024};
  std::string e = error_of([&] { io::check_compatible(expected, loaded, "checkpoint 'runs/a/step_00000100'"); });
  EXPECT_HAS(e, "checkpoint from another model shape");
  EXPECT_HAS(e, "tensor 'h.0.attn.weight' is [768, 2304] in checkpoint 'runs/a/step_00000100' but [1024, 3072] in "
                "the model");
  EXPECT_HAS(e, "shape mismatches: 2");

  io::NamedShapes more{{"wte.weight", {50304, 768}}, {"h.1.attn.weight", {768, 2304}}};
  e = error_of([&] { io::check_compatible(more, loaded); });
  EXPECT_HAS(e, "tensor 'h.1.attn.weight' ([768, 2304] in the model) is missing from the checkpoint");
  EXPECT_HAS(e, "missing: 1");
  EXPECT_HAS(e, "unexpected: 2");

  io::NamedShapes fewer{{"wte.weight", {50304, 768}}, {"h.0.attn.weight", {768, 2304}}};
  e = error_of([&] { io::check_compatible(fewer, loaded); });
  EXPECT_HAS(e, "tensor 'ln_f.weight' [768] is in the checkpoint but not in the model");
}

TEST(Checkpoint, LoadErrorsNameTheFileAndTheField) {
  ScratchDir dir;
  const fs::path ck = dir / "ck";
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "is not a directory");

  io::save_checkpoint(ck, sample_checkpoint(5));
  const fs::path state = ck / "state.json";
  const json good = json::parse(slurp(state));

  spit(state, "{ not json");
  std::string e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, state.string());
  EXPECT_HAS(e, "not valid JSON");

  json j = good;
  j["format_version"] = io::kCheckpointFormatVersion + 1;
  spit(state, j.dump());
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, "written by a newer forge");

  j = good;
  j["rng"]["default"].erase("offset");
  spit(state, j.dump());
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, state.string());
  EXPECT_HAS(e, "missing field 'rng.default.offset'");

  j = good;
  j["step"] = "ten";
  spit(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "field 'step' must be an integer");

  j = good;
  j["rng"]["generators"]["g"] = {{"seed", -1}, {"offset", 0}};
  spit(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "field 'rng.generators.g.seed' must be a non-negative");

  j = good;
  j["format"] = "something-else";
  spit(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "format is 'something-else'");

  spit(state, good.dump());
  fs::remove(ck / "optimizer.safetensors");
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, ck.string());
  EXPECT_HAS(e, "not a complete checkpoint: optimizer.safetensors is missing");
  fs::remove(state);
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, "not a complete checkpoint");
  EXPECT_HAS(e, state.string());
  EXPECT_HAS(e, "No such file or directory");
}

}  // namespace
}  // namespace forge::testing
