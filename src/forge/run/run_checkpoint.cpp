// Checkpoint plumbing shared by every layout (contracts in run_checkpoint.h).
#include "forge/run/run_checkpoint.h"

#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "forge/core/error.h"
#include "forge/optim/adamw.h"
#include "forge/optim/sgd.h"

namespace forge::train {

namespace fs = std::filesystem;

CreatedRunDir::~CreatedRunDir() {
  if (!created_) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const bool own_lock = entry.path().filename() == "forge.lock" && entry.is_regular_file(ec) && entry.file_size(ec) == 0;
    if (!own_lock) return;
  }
  if (ec) return;
  fs::remove(dir_ / "forge.lock", ec);
  fs::remove(dir_, ec);  // (only an empty directory)
}
using nlohmann::json;

fs::path resolve_checkpoint(const fs::path& p, const char* who, std::ostream* warn) {
  std::error_code ec;
  if (fs::is_regular_file(p / "state.json", ec)) return p;
  FORGE_CHECK(fs::exists(p, ec), who, ": '", p.string(), "' does not exist");
  const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(p);
  std::ostream& w = warn != nullptr ? *warn : std::cerr;
  for (const auto& s : v.skipped) w << "warning: " << s << "; skipped, an older checkpoint is used" << std::endl;
  if (v.dir) return *v.dir;
  FORGE_CHECK(v.skipped.empty(), who, ": no valid checkpoint in '", p.string(), "': all ", v.skipped.size(),
              " failed verification (newest: ", v.skipped.front(), ")");
  FORGE_THROW(who, ": '", p.string(),
              "' is neither a checkpoint directory (with state.json) nor a run directory with checkpoints");
}

RunStart choose_run_start(const RunConfig& cfg, bool resume, const std::string& resume_from, const fs::path& run_dir,
                          bool owner) {
  RunStart start;
  std::error_code ec;
  const fs::path metrics = run_dir / "metrics.jsonl";
  if (resume) {
    std::stringstream warn;
    if (resume_from.empty()) {
      const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(run_dir);
      for (const auto& s : v.skipped) start.notes.push_back("warning: " + s + "; skipped, an older checkpoint is used");
      FORGE_CHECK(v.dir.has_value(), "--resume: no ", v.skipped.empty() ? "" : "valid ", "checkpoint in '",
                  (run_dir / "checkpoints").string(), "'",
                  v.skipped.empty() ? std::string() : " (" + std::to_string(v.skipped.size()) + " failed verification; "
                  "newest: " + v.skipped.front() + ")",
                  "; start the run without --resume, or give a checkpoint: --resume PATH");
      start.checkpoint = v.dir;
      start.verified = true;
    } else {
      start.checkpoint = resolve_checkpoint(resume_from, "--resume", &warn);
      for (std::string line; std::getline(warn, line);)
        if (!line.empty()) start.notes.push_back(line);
    }
    return start;
  }
  const auto existing = io::list_checkpoints(run_dir);
  if (cfg.run.overwrite) {
    if (owner && (!existing.empty() || fs::exists(metrics, ec))) {
      fs::remove_all(run_dir / "checkpoints", ec);
      fs::remove(metrics, ec);
      fs::remove_all(run_dir / "tb", ec);
      start.notes.push_back("run: starting afresh in " + run_dir.string() +
                            " (run.overwrite: the earlier run's checkpoints and metrics removed)");
    }
    return start;
  }
  const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(run_dir);
  for (const auto& s : v.skipped) start.notes.push_back("warning: " + s + "; skipped, an older checkpoint is used");
  if (v.dir) {
    start.checkpoint = v.dir;
    start.verified = true;
    return start;
  }
  if (!v.skipped.empty()) {
    std::string all;
    for (const auto& s : v.skipped) all += "\n  " + s;
    FORGE_THROW("run directory '", run_dir.string(), "' holds ", v.skipped.size(),
                " checkpoint(s) and none passes verification:", all,
                "\nforge does not restart such a run from step 0 by itself: restore a checkpoint, resume an older "
                "one with --resume PATH, or start afresh with --run.overwrite=true (which removes them)");
  }
  if (owner && (fs::exists(metrics, ec) || fs::exists(run_dir / "tb", ec))) {
    // An earlier attempt that stopped before its first checkpoint: its records would otherwise be
    // followed by this run's from step 1.
    fs::remove(metrics, ec);
    fs::remove_all(run_dir / "tb", ec);
    start.notes.push_back("run: an earlier attempt in " + run_dir.string() +
                          " left metrics but no checkpoint; starting at step 0 (its metrics removed)");
  }
  return start;
}

std::unique_ptr<optim::Optimizer> make_optimizer_for(const RunConfig& cfg, std::vector<optim::ParamGroup> groups) {
  if (cfg.optim.name == "sgd") {
    optim::SGDOptions o;
    o.lr = cfg.optim.lr;
    o.momentum = cfg.optim.momentum;
    o.nesterov = cfg.optim.nesterov;
    o.weight_decay = cfg.optim.weight_decay;
    return std::make_unique<optim::SGD>(std::move(groups), o);
  }
  optim::AdamWOptions o;
  o.lr = cfg.optim.lr;
  o.beta1 = cfg.optim.beta1;
  o.beta2 = cfg.optim.beta2;
  o.eps = cfg.optim.eps;
  o.weight_decay = cfg.optim.weight_decay;
  return std::make_unique<optim::AdamW>(std::move(groups), o);
}

std::string optimizer_class_name(const RunConfig& cfg) { return cfg.optim.name == "sgd" ? "SGD" : "AdamW"; }

std::vector<std::pair<std::string, Tensor>> optimizer_slots(const RunConfig& cfg, const nn::Module& model) {
  const auto named = model.named_parameters();
  std::unordered_map<const TensorImpl*, std::string> name_of;
  for (const auto& [n, t] : named) name_of.emplace(t.impl(), n);
  std::vector<std::pair<std::string, Tensor>> slots;
  for (const auto& g : optim::decay_groups(named, cfg.optim.weight_decay))
    for (const Tensor& t : g.params) slots.emplace_back(name_of.at(t.impl()), t);
  return slots;
}

const json& checkpoint_optimizer_record(const io::CheckpointData& ck, const fs::path& ck_path, const std::string& want) {
  static const json none;
  const json& o = ck.extra.is_object() && ck.extra.contains("optimizer") ? ck.extra["optimizer"] : none;
  FORGE_CHECK(o.is_object() && o.contains("scalars"), "--resume: checkpoint '", ck_path.string(),
              "' has no optimizer scalars (extra.optimizer); it was not written by `forge train`");
  const std::string name = o.value("name", std::string());
  FORGE_CHECK(name == want, "--resume: checkpoint '", ck_path.string(), "' holds ", name, " state but optim.name makes ",
              want, "; set optim.name to match the checkpoint");
  return o;
}

parallel::RangedState ranged_optimizer_state(const io::CheckpointData& ck, const fs::path& ck_path,
                                         const std::vector<std::pair<std::string, Tensor>>& slots) {
  parallel::RangedState rs;
  if (ck.extra.is_object() && ck.extra.contains("dist")) {
    for (const auto& f : ck.extra["dist"].value("files", json::array())) {
      const fs::path file = ck_path / f.get<std::string>();
      std::error_code ec;
      FORGE_CHECK(fs::is_regular_file(file, ec), "--resume: checkpoint '", ck_path.string(), "' lacks its shard file '",
                  file.filename().string(), "'");
      rs.add_shard_file(file);
    }
    return rs;
  }
  const json& o = ck.extra.is_object() && ck.extra.contains("optimizer") ? ck.extra["optimizer"] : json();
  std::map<std::string, double> scalars;
  if (o.is_object() && o.contains("scalars"))
    for (const auto& [k, v] : o["scalars"].items()) scalars[k] = v.get<double>();
  std::vector<std::string> names;
  for (const auto& [n, t] : slots) names.push_back(n);
  rs.add_full_state(ck.optimizer, scalars, names);
  return rs;
}

void restore_optimizer(optim::Optimizer& opt, const io::CheckpointData& ck, const fs::path& ck_path,
                       const std::vector<std::pair<std::string, Tensor>>& slots) {
  const json& o = checkpoint_optimizer_record(ck, ck_path, opt.name());
  if (ck.extra.contains("dist")) {
    // Written by a data-parallel run: reassemble every parameter's state from the shards.
    const parallel::RangedState rs = ranged_optimizer_state(ck, ck_path, slots);
    optim::StateDict sd = opt.state_dict();  // the group scalars of this optimizer
    for (auto it = sd.scalars.begin(); it != sd.scalars.end();)
      it = it->first.rfind("state.", 0) == 0 ? sd.scalars.erase(it) : std::next(it);
    sd.tensors.clear();
    sd.scalars["step"] = o["scalars"].value("step", 0.0);
    for (size_t k = 0; k < slots.size(); ++k) {
      const auto& [pname, p] = slots[k];
      const int64_t steps = rs.step(pname, 0, p.numel());
      if (steps <= 0) continue;
      const std::string pre = "state." + std::to_string(k) + ".";
      sd.scalars[pre + "step"] = static_cast<double>(steps);
      for (const auto& sname : rs.state_names()) {
        if (sname == "master" && p.dtype() == DType::f32) continue;
        const Tensor t = rs.get(pname, sname, 0, p.numel());
        if (t.defined()) sd.tensors[pre + sname] = t.reshape(p.shape());
      }
    }
    opt.load_state_dict(sd);
    return;
  }
  optim::StateDict sd;
  for (const auto& [k, v] : o["scalars"].items()) sd.scalars[k] = v.get<double>();
  for (const auto& [k, t] : ck.optimizer) sd.tensors[k] = t;
  opt.load_state_dict(sd);
}

fs::path checkpoint_staging(const fs::path& dir, int64_t step, bool create) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(step));
  const fs::path staging = dir.parent_path() / (dir.filename().string() + ".tmp.0." + hex);
  if (create) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    FORGE_CHECK(!ec, "checkpoint: cannot create the staging directory '", staging.string(), "': ", ec.message());
  }
  return staging;
}

std::string optimizer_shard_name(int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "optimizer.rank%05d.safetensors", rank);
  return name;
}

void restore_loss_scaler(optim::LossScaler& scaler, const io::CheckpointData& ck) {
  if (!ck.extra.is_object() || !ck.extra.contains("loss_scaler")) return;
  optim::StateDict sd;
  for (const auto& [k, v] : ck.extra["loss_scaler"].items()) sd.scalars[k] = v.get<double>();
  scaler.load_state_dict(sd);
}

}  // namespace forge::train
