// forge train's side of FP8 (contracts in fp8_state.h).
#include "forge/train/fp8_state.h"

#include <cmath>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/creation.h"

namespace forge::train {

using nlohmann::json;

namespace {
constexpr fp8::Operand kFp8Operands[] = {fp8::Operand::activation, fp8::Operand::weight, fp8::Operand::gradient};
// The GEMM choices reported so far (they are kept in a map: the new ones are reported by count);
// a run's configure_fp8 starts again from none, as set_selection clears the choices.
size_t g_reported_choices = 0;
}  // namespace

bool configure_fp8(const RunConfig& cfg, const parallel::Layout& layout, Device device, const io::CheckpointData* ck,
                   const std::filesystem::path& ck_path, std::ostream& log) {
  const bool on = cfg.run.fp8 != "off";
  const bool delayed = on && cfg.run.fp8_scaling == "delayed";
  // Note [FP8 on the GPU]: what the GPU path does not do yet, refused before any work.
  FORGE_CHECK(!on || !device.is_cuda() || layout.tp == 1, "run.fp8 with dist.tp = ", layout.tp, " runs in the CPU "
              "emulation only so far (issue 39: the GPU casts do not reduce their amaxes over the tensor-parallel "
              "group yet); on GPUs use dist.tp = 1 with run.fp8, or run.fp8 = \"off\"");
  fp8::set_training_recipe(on ? std::optional(fp8::recipe_from_name(cfg.run.fp8)) : std::nullopt);
  // A deterministic run chooses by shape alone, never by a timing (as its GEMM algorithms).
  g_reported_choices = 0;
  fp8::set_selection(cfg.run.fp8_select == "all" || cfg.run.deterministic ? fp8::Selection::all
                                                                          : fp8::Selection::measured);
  FORGE_CHECK(!delayed || (layout.tp == 1 && layout.pp == 1 && layout.cp == 1), "run.fp8_scaling = \"delayed\" "
              "with dist.tp, dist.pp or dist.cp > 1 is not supported yet (the ranks would keep different histories: "
              "other layers, or other shards of a split operand); use run.fp8_scaling = \"current\", or data "
              "parallelism alone (its ranks' histories are kept equal)");
  fp8::set_training_scaling({.scaling = delayed ? fp8::Scaling::delayed : fp8::Scaling::current,
                             .history = cfg.run.fp8_amax_history});
  if (delayed && ck) {
    if (ck->extra.is_object() && ck->extra.contains(kFp8HistoriesKey)) {
      fp8::restore_amax_histories(
          fp8_histories_from(ck->extra[kFp8HistoriesKey], cfg.run.fp8_amax_history, "checkpoint " + ck_path.string()));
    } else {
      log << "fp8: checkpoint " << ck_path.string() << " holds no amax histories (its run scaled FP8 casts "
          << "currently): delayed scaling starts from empty histories\n";
    }
  }
  return delayed;
}

void set_fp8_amax_group(const parallel::ProcessGroupPtr& group) {
  fp8::set_amax_reduce(nullptr);
  fp8::set_amax_reduce_device(nullptr);
  if (!group || group->size() == 1) return;
  fp8::set_amax_reduce_device([weak = std::weak_ptr<parallel::ProcessGroup>(group)](Tensor& amax) {
    const parallel::ProcessGroupPtr g = weak.lock();
    FORGE_CHECK(g != nullptr, "fp8: the data-parallel group of delayed scaling is gone");
    g->all_reduce(amax, parallel::ReduceOp::max)->wait();  // (NCCL: queued on the stream)
  });
  fp8::set_amax_reduce([weak = std::weak_ptr<parallel::ProcessGroup>(group)](std::vector<float>& amax) {
    const parallel::ProcessGroupPtr g = weak.lock();  // (the process-wide hook never owns the group)
    FORGE_CHECK(g != nullptr, "fp8: the data-parallel group of delayed scaling is gone");
    const Tensor t = from_vector(amax, {static_cast<int64_t>(amax.size())});
    g->all_reduce(t, parallel::ReduceOp::max)->wait();
    amax = t.to_vector<float>();
  });
}

json fp8_histories_json() {
  json j = json::object();
  for (const auto& [layer, ops] : fp8::amax_histories()) {
    json o = json::object();
    for (fp8::Operand op : kFp8Operands) o[fp8::operand_name(op)] = ops[static_cast<size_t>(op)];
    j[layer] = o;
  }
  return j;
}

fp8::AmaxHistories fp8_histories_from(const json& j, int64_t keep, const std::string& where) {
  FORGE_CHECK(j.is_object(), where, ": extra.", kFp8HistoriesKey, " is not an object of layers");
  fp8::AmaxHistories h;
  for (const auto& [layer, o] : j.items()) {
    FORGE_CHECK(o.is_object(), where, ": extra.", kFp8HistoriesKey, ".", layer, " is not an object of operands");
    auto& ops = h[layer];
    for (fp8::Operand op : kFp8Operands) {
      const char* name = fp8::operand_name(op);
      if (!o.contains(name)) continue;
      FORGE_CHECK(o[name].is_array(), where, ": extra.", kFp8HistoriesKey, ".", layer, ".", name, " is not an array");
      std::vector<float>& v = ops[static_cast<size_t>(op)];
      for (const auto& e : o[name]) {
        FORGE_CHECK(e.is_number() && std::isfinite(e.get<double>()) && e.get<double>() >= 0, where, ": extra.",
                    kFp8HistoriesKey, ".", layer, ".", name, " holds ", e.dump(), ", not a finite amax");
        v.push_back(e.get<float>());
      }
      if (static_cast<int64_t>(v.size()) > keep) v.erase(v.begin(), v.end() - keep);  // a shorter history asked now
    }
  }
  return h;
}

json fp8_amax_record_json() {
  json a = json::object();
  for (const auto& [layer, m] : fp8::take_amax_record()) {
    json o = json::object();
    for (fp8::Operand op : kFp8Operands)
      if (m[static_cast<size_t>(op)] >= 0) o[fp8::operand_name(op)] = m[static_cast<size_t>(op)];
    a[layer] = o;
  }
  return a;
}

void report_fp8_gemm_choices(std::ostream& log) {
  const std::vector<fp8::GemmChoice> choices = fp8::gemm_choices();
  if (choices.size() <= g_reported_choices) return;
  g_reported_choices = choices.size();
  int64_t in_fp8 = 0;
  for (const fp8::GemmChoice& c : choices) in_fp8 += c.fp8 ? 1 : 0;
  log << "fp8: " << in_fp8 << " of " << choices.size() << " linear shapes in FP8 (" << fp8::recipe_name(choices[0].recipe)
      << "; tokens x out x in: three GEMMs, bf16 ms vs FP8 ms with casts):";
  for (const fp8::GemmChoice& c : choices) {
    log << "\n  " << c.m << " x " << c.n << " x " << c.k << ": " << (c.fp8 ? "FP8" : dtype_name(c.dtype));
    if (c.bf16_ms > 0) log << " (" << std::fixed << std::setprecision(3) << c.bf16_ms << " vs " << c.fp8_ms << " ms)";
    log << std::defaultfloat << " [" << c.reason << "]";
  }
  log << std::endl;
}

void report_fp8_guard_events(int64_t step, std::ostream& log, bool all) {
  static int64_t logged = 0;
  const std::vector<fp8::GuardEvent> events = all ? fp8::take_guard_events() : fp8::take_queued_guard_events();
  for (const fp8::GuardEvent& e : events)
    if (logged++ < 20)
      log << "fp8: step " << (e.step > 0 ? e.step : step) << ": non-finite amax (" << e.amax << ") in " << e.layer << " ("
          << fp8::operand_name(e.operand) << "): its group's scale is unusable; the step's non-finite check skips it"
          << std::endl;
  if (!events.empty() && logged > 20)
    log << "fp8: step " << (events.back().step > 0 ? events.back().step : step) << ": " << events.size()
        << " non-finite amax event(s)" << std::endl;
}

}  // namespace forge::train
