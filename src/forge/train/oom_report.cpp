// The out-of-memory snapshot of forge train (contract in oom_report.h).
#include "forge/train/oom_report.h"

#include <filesystem>

#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/parallel/env.h"
#include "forge/plan/cpu_device.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"
#include "forge/telemetry/mfu.h"
#include "forge/run/layout.h"
#include "forge/run/run_model_spec.h"

namespace forge::train {

namespace fs = std::filesystem;

plan::PlanInput plan_input_of_run(const RunConfig& cfg, const parallel::Layout& layout, Device device, int world_size) {
  plan::PlanInput in;
  in.model = model_spec_of(cfg);
  plan::GpuSpec gpu = plan::cpu_device(0);
  if (device.is_cuda()) {
    // The driver's name ("NVIDIA H200") to the catalogue's entry, as the MFU figure finds it.
    const std::string name = runtime::device_name(device);
    const std::optional<std::string> entry = telemetry::catalogue_name(name);
    FORGE_CHECK(entry.has_value(), "forge plan's catalogue has no entry for the GPU '", name,
                "'; forge plan --list-gpus lists those it has");
    gpu = plan::find_gpu(*entry);
  }
  in.cluster = plan::make_cluster(gpu, world_size);
  const DType dt = resolve_run_dtype(cfg.run.dtype, device);
  in.setup.precision = dt == DType::bf16   ? plan::Precision::bf16
                       : dt == DType::f16  ? plan::Precision::fp16
                       : cfg.run.allow_tf32 && device.is_cuda() ? plan::Precision::tf32
                                                                : plan::Precision::fp32;
  in.setup.optimizer = plan::parse_optimizer(cfg.optim.name);
  in.setup.activations.model = plan::ActivationModel::forge;
  in.setup.activations.attention = plan::AttentionKind::flash;
  in.setup.activations.dropout = cfg.model.dropout > 0;
  in.setup.margin = device.is_cuda() ? 0.10 : 0.0;
  in.setup.reserve_bytes = device.is_cuda() ? 1e9 : 0.0;
  in.setup.bucket_bytes = cfg.dist.bucket_mb * 1e6;
  in.layout = layout;
  in.global_batch = layout.global_batch();
  in.tokens = static_cast<double>(cfg.train.steps) * static_cast<double>(in.global_batch * cfg.train.seq_len);
  return in;
}

nlohmann::json oom_report(const OutOfMemoryError& e, const RunConfig& cfg) {
  const MemorySnapshot& s = e.snapshot();
  nlohmann::json live = nlohmann::json::array();
  for (const OwnerBytes& o : s.live) live.push_back({{"owner", o.owner}, {"blocks", o.blocks}, {"bytes", o.bytes}});
  nlohmann::json j = {
      {"error", e.what()},
      {"requested_bytes", s.requested},
      {"failed_owner", s.failed_owner},
      {"allocator",
       {{"name", s.allocator},
        {"allocated_bytes", s.stats.allocated},
        {"peak_allocated_bytes", s.stats.peak_allocated},
        {"reserved_bytes", s.stats.reserved},
        {"segments", s.segments},
        {"cached_free_bytes", s.cached_free_bytes},
        {"largest_free_block_bytes", s.largest_free_block},
        // The share of the cached free bytes a request cannot use in one piece.
        {"fragmentation", s.cached_free_bytes > 0 ? 1.0 - static_cast<double>(s.largest_free_block) /
                                                             static_cast<double>(s.cached_free_bytes)
                                                  : 0.0},
        {"pending_blocks", s.pending_blocks},
        {"device_free_bytes", s.device_free},
        {"device_total_bytes", s.device_total},
        {"limit_bytes", s.limit}}},
      {"live_by_owner", live}};
  try {
    // The run's resolved config (a vocabulary taken from the tokenizer, init_from's shape), when
    // the run got as far as writing it.
    const fs::path resolved = fs::path(cfg.run_dir()) / "config.toml";
    std::error_code ec;
    const RunConfig run = fs::exists(resolved, ec) ? load_config(resolved.string(), {}) : cfg;
    const parallel::LaunchEnv env = parallel::launch_env();
    const parallel::Layout layout = run_layout(run, env.world_size);
    Device device = resolve_run_device(run.run.device);
    if (device.is_cuda() && env.world_size > 1) device = Device::cuda(env.local_rank);
    const plan::PlanInput in = plan_input_of_run(run, layout, device, env.world_size);
    const plan::PlanResult r = plan::evaluate(in);
    const plan::MemoryBreakdown& m = r.memory;
    j["plan"] = {{"command", "forge plan --config " + resolved.string() + " --gpu '" + in.cluster.gpu.name +
                                 "' --gpus " + std::to_string(env.world_size)},
                 {"layout", layout.describe()},
                 {"memory_per_gpu_bytes",
                  {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                   {"activations", m.activations}, {"transient", m.transient}, {"comm_buffers", m.comm_buffers},
                   {"margin", m.margin}, {"reserve", m.reserve}, {"total", m.total}}},
                 {"gpu_memory_bytes", in.cluster.gpu.memory_gb * 1e9},
                 {"fits", m.total <= in.cluster.gpu.memory_gb * 1e9}};
  } catch (const std::exception& x) {
    j["plan_error"] = x.what();
  }
  return j;
}

std::string write_oom_report(const OutOfMemoryError& e, const RunConfig& cfg) {
  try {
    const fs::path dir(cfg.run_dir());
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path path = dir / ("oom_snapshot.rank" + std::to_string(parallel::launch_env().rank) + ".json");
    io::write_file_atomic(path, oom_report(e, cfg).dump(2) + "\n");
    return path.string();
  } catch (...) {
    return "";
  }
}

}  // namespace forge::train
