// forge::io checkpoints (src/forge/io/checkpoint.h): tensors, RNG streams and JSON state come
// back exactly; a failed save keeps the previous checkpoint; find_latest_checkpoint skips the
// temporaries of an interrupted save; check_compatible names the tensor and both shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "forge/io/checksum.h"
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
  d.model = io::NamedTensors{{"wte.weight", random_finite_bits(DType::bf16, {16, 8}, 1)},
                             {"h.0.ln_1.weight", random_finite_bits(DType::f32, {8}, 2)},
                             {"h.0.attn.c_attn.weight", random_finite_bits(DType::bf16, {8, 24}, 3).t()},  // a view
                             {"lm_head.bias", random_finite_bits(DType::f32, {0}, 4)}};
  d.optimizer = io::NamedTensors{{"step", scalar_tensor(static_cast<double>(step), {.dtype = DType::i64})},
                                 {"exp_avg.wte.weight", random_finite_bits(DType::f32, {16, 8}, 5)},
                                 {"exp_avg_sq.wte.weight", random_finite_bits(DType::f32, {16, 8}, 6)},
                                 {"master.wte.weight", random_finite_bits(DType::f64, {16, 8}, 7)},
                                 {"ids", random_bits(DType::i32, {5}, 8)}};  // integers: any bits
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
  EXPECT_EQ(listing(ck), (std::vector<std::string>{"manifest.json", "model.safetensors", "optimizer.safetensors",
                                                   "state.json"}));

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
  EXPECT_EQ(state["format_version"], 2);
  EXPECT_EQ(state["step"], 1200);
  EXPECT_TRUE(r.verified);
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
  // The latest valid one too; the empty step_00000400 is named as skipped (a file could not vanish
  // from a published checkpoint by itself).
  const io::ValidCheckpoint valid = io::find_latest_valid_checkpoint(run.path());
  EXPECT_EQ(valid.dir, io::checkpoint_path(run.path(), 100));
  ASSERT_EQ(valid.skipped.size(), 1u);
  EXPECT_HAS(valid.skipped[0], "step_00000400' is not a complete checkpoint: state.json is missing");
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
  EXPECT_HAS(e, "shape or dtype mismatches: 2");

  io::NamedShapes more{{"wte.weight", {50304, 768}}, {"h.1.attn.weight", {768, 2304}}};
  e = error_of([&] { io::check_compatible(more, loaded); });
  EXPECT_HAS(e, "tensor 'h.1.attn.weight' ([768, 2304] in the model) is missing from the checkpoint");
  EXPECT_HAS(e, "missing: 1");
  EXPECT_HAS(e, "unexpected: 2");

  // Issue 43: weights stored as integers (they evaluated to a loss of NaN, exit 0, and exported as I32).
  const io::NamedTensors ints{{"wte.weight", zeros({50304, 768})}, {"h.0.attn.weight", zeros({768, 2304}, {.dtype = DType::i32})},
                              {"ln_f.weight", zeros({768})}};
  e = error_of([&] { io::check_compatible(io::named_shapes(loaded), ints, "checkpoint 'c'"); });
  EXPECT_HAS(e, "checkpoint with weights that are not floating point: tensor 'h.0.attn.weight' is stored as i32 in "
                "checkpoint 'c'");

  io::NamedShapes fewer{{"wte.weight", {50304, 768}}, {"h.0.attn.weight", {768, 2304}}};
  e = error_of([&] { io::check_compatible(fewer, loaded); });
  EXPECT_HAS(e, "tensor 'ln_f.weight' [768] is in the checkpoint but not in the model");
}

// Rewrites the manifest of checkpoint `ck` to match its files as they are now: an edit made
// consistently, so the tests below reach the checks behind the checksums.
void reseal(const fs::path& ck) {
  json m = json::parse(slurp(ck / "manifest.json"));
  for (auto& [name, e] : m["files"].items()) {
    const io::FileDigest d = io::file_digest(ck / name);
    e = {{"bytes", d.bytes}, {"hash", d.hash}};
  }
  spit(ck / "manifest.json", m.dump());
}

TEST(Checkpoint, LoadErrorsNameTheFileAndTheField) {
  ScratchDir dir;
  const fs::path ck = dir / "ck";
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "is not a directory");

  io::save_checkpoint(ck, sample_checkpoint(5));
  const fs::path state = ck / "state.json";
  const json good = json::parse(slurp(state));
  // Each edit below is resealed (the manifest matches it), so it is the field checks that speak.
  const auto spit_sealed = [&](const fs::path& p, const std::string& text) {
    spit(p, text);
    reseal(ck);
  };

  spit_sealed(state, "{ not json");
  std::string e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, state.string());
  EXPECT_HAS(e, "not valid JSON");

  json j = good;
  j["format_version"] = io::kCheckpointFormatVersion + 1;
  spit_sealed(state, j.dump());
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, "written by a newer forge");

  j = good;
  j["rng"]["default"].erase("offset");
  spit_sealed(state, j.dump());
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, state.string());
  EXPECT_HAS(e, "missing field 'rng.default.offset'");

  j = good;
  j["step"] = "ten";
  spit_sealed(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "field 'step' must be an integer");

  j = good;
  j["rng"]["generators"]["g"] = {{"seed", -1}, {"offset", 0}};
  spit_sealed(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "field 'rng.generators.g.seed' must be a non-negative");

  j = good;
  j["format"] = "something-else";
  spit_sealed(state, j.dump());
  EXPECT_HAS(error_of([&] { io::load_checkpoint(ck); }), "format is 'something-else'");

  spit_sealed(state, good.dump());
  EXPECT_EQ(io::load_checkpoint(ck).step, 5);
  fs::remove(ck / "optimizer.safetensors");
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, ck.string());
  EXPECT_HAS(e, "not a complete checkpoint: optimizer.safetensors is missing");
  fs::remove(state);
  e = error_of([&] { io::load_checkpoint(ck); });
  EXPECT_HAS(e, ck.string());
  EXPECT_HAS(e, "not a complete checkpoint: state.json is missing");
}

// Note [checkpoint integrity]: a flipped byte, a truncated or deleted file and an edited step are
// each refused, naming the file; the run's latest valid checkpoint is the one before.
TEST(Checkpoint, DamagedFilesAndEditedStepsAreNeverLoaded) {
  ScratchDir run;
  const fs::path good = io::checkpoint_path(run.path(), 10), ck = io::checkpoint_path(run.path(), 20);
  io::save_checkpoint(good, sample_checkpoint(10));
  const json manifest = json::parse(slurp(good / "manifest.json"));
  EXPECT_EQ(manifest["format"], "forge-checkpoint-manifest");
  EXPECT_EQ(manifest["step"], 10);
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    EXPECT_EQ(manifest["files"][f]["bytes"].get<uint64_t>(), fs::file_size(good / f)) << f;
    EXPECT_EQ(manifest["files"][f]["hash"].get<std::string>(), io::file_digest(good / f).hash) << f;
    EXPECT_EQ(manifest["files"][f]["hash"].get<std::string>().rfind("xxh3:", 0), 0u) << f;
  }
  EXPECT_TRUE(io::verify_checkpoint(good));

  struct Damage {
    const char* label;
    std::function<void()> apply;
    std::string expected;  // in the error
  };
  const std::vector<Damage> damages = {
      {"a byte flipped in the model", [&] {
         std::string b = slurp(ck / "model.safetensors");
         b[b.size() / 2] ^= 0x10;
         spit(ck / "model.safetensors", b);
       }, "model.safetensors does not match its checksum"},
      {"a byte flipped in the optimizer state", [&] {
         std::string b = slurp(ck / "optimizer.safetensors");
         b[b.size() - 3] ^= 0x01;
         spit(ck / "optimizer.safetensors", b);
       }, "optimizer.safetensors does not match its checksum"},
      {"the optimizer file truncated", [&] {
         fs::resize_file(ck / "optimizer.safetensors", fs::file_size(ck / "optimizer.safetensors") - 8);
       }, "optimizer.safetensors is "},
      {"the model file deleted", [&] { fs::remove(ck / "model.safetensors"); }, "model.safetensors is missing"},
      {"the manifest deleted", [&] { fs::remove(ck / "manifest.json"); }, "manifest.json is missing"},
      {"the step edited in state.json", [&] {
         json j = json::parse(slurp(ck / "state.json"));
         j["step"] = 21;
         spit(ck / "state.json", j.dump(2) + "\n");  // as forge writes it: the same size, another checksum
       }, "state.json does not match its checksum"},
      {"the step edited in state.json and the manifest resealed", [&] {
         json j = json::parse(slurp(ck / "state.json"));
         j["step"] = 21;
         spit(ck / "state.json", j.dump());
         reseal(ck);
       }, "state.json says step 21 but manifest.json says step 20"},
      {"the step edited in both, resealed", [&] {
         json j = json::parse(slurp(ck / "state.json"));
         j["step"] = 21;
         spit(ck / "state.json", j.dump());
         json m = json::parse(slurp(ck / "manifest.json"));
         m["step"] = 21;
         spit(ck / "manifest.json", m.dump());
         reseal(ck);
       }, "the directory is named for step 20 but holds step 21"},
      {"the manifest's format a number (a fuzzing finding: it escaped as a JSON type error)", [&] {
         json m = json::parse(slurp(ck / "manifest.json"));
         m["format"] = 40;
         spit(ck / "manifest.json", m.dump());
       }, "is not a forge checkpoint manifest"},
      {"a model file of another step, resealed", [&] {
         fs::copy_file(good / "model.safetensors", ck / "model.safetensors", fs::copy_options::overwrite_existing);
         reseal(ck);
       }, "model.safetensors is of step 10 but the checkpoint is of step 20"},
  };
  for (const auto& d : damages) {
    SCOPED_TRACE(d.label);
    io::save_checkpoint(ck, sample_checkpoint(20));
    ASSERT_EQ(io::load_checkpoint(ck).step, 20);
    d.apply();
    const std::string e = error_of([&] { io::load_checkpoint(ck); });
    EXPECT_HAS(e, ck.string());
    EXPECT_HAS(e, d.expected);
    EXPECT_HAS(error_of([&] { io::verify_checkpoint(ck); }), d.expected);
    // The run's latest valid checkpoint is the one before, and why the newer one was skipped is said.
    const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(run.path());
    ASSERT_TRUE(v.dir.has_value());
    EXPECT_EQ(*v.dir, good);
    ASSERT_EQ(v.skipped.size(), 1u);
    EXPECT_HAS(v.skipped[0], d.expected);
    fs::remove_all(ck);
  }
}

TEST(Checkpoint, NonFiniteStateIsNeverWritten) {
  ScratchDir dir;
  const fs::path ck = dir / "ck";
  io::save_checkpoint(ck, sample_checkpoint(1));
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(bad));
      CheckpointData d = sample_checkpoint(2);
      Tensor t = random_finite_bits(dtype, {4, 6}, 11);
      t.reshape({-1}).narrow(0, 13, 1).fill_(bad);
      d.optimizer.insert("exp_avg.bad", t);
      const std::string e = error_of([&] { io::save_checkpoint(ck, d); });
      EXPECT_HAS(e, "checkpoint of step 2 not written");
      EXPECT_HAS(e, "tensor 'exp_avg.bad' [4, 6] holds " + std::string(std::isnan(bad) ? "NaN" : bad > 0 ? "+inf" : "-inf"));
      EXPECT_HAS(e, "first at element 13");
      EXPECT_EQ(io::load_checkpoint(ck).step, 1);  // the previous one is untouched
    }
  }
  // In the model too, and in a strided view.
  CheckpointData d = sample_checkpoint(3);
  Tensor w = random_finite_bits(DType::f32, {6, 4}, 12);
  w.narrow(0, 5, 1).narrow(1, 2, 1).fill_(std::nan(""));
  d.model.insert("h.1.mlp.weight", w.t());
  EXPECT_HAS(error_of([&] { io::save_checkpoint(ck, d); }), "tensor 'h.1.mlp.weight' [4, 6] holds NaN");
  EXPECT_EQ(io::load_checkpoint(ck).step, 1);
}

// A checkpoint of format_version 1 (before manifests) still loads, and says it is unverified.
TEST(Checkpoint, VersionOneCheckpointsLoadUnverified) {
  ScratchDir dir;
  const fs::path ck = dir / "ck";
  io::save_checkpoint(ck, sample_checkpoint(7));
  fs::remove(ck / "manifest.json");
  json j = json::parse(slurp(ck / "state.json"));
  j["format_version"] = 1;
  spit(ck / "state.json", j.dump());
  EXPECT_FALSE(io::verify_checkpoint(ck));
  const CheckpointData r = io::load_checkpoint(ck);
  EXPECT_EQ(r.step, 7);
  EXPECT_FALSE(r.verified);
}

}  // namespace
}  // namespace forge::testing
