// telemetry.profile_steps (contract and Note [step trace] in step_trace.h).
#include "forge/train/step_trace.h"

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/run/run_values.h"

#include "forge/backends/device_runtime.h"

namespace forge::train {

namespace {
// The phases between marks i and i + 1 (train/phase_marks.h).
const char* const kPhase[] = {"forward (last micro-batch)", "backward (last micro-batch)", "gradient reductions (wait)",
                              "loss, norm and clip", "update"};
constexpr int kMarks = 6;
}  // namespace

// The device's side of a GPU run's trace (backends/device_runtime.h): events on its current stream
// and the kernels' records.
struct StepTrace::Device_ {
  explicit Device_(Device d) : kernels(d) {}
  std::unique_ptr<runtime::Event> base;  // recorded with t0_
  std::vector<std::vector<runtime::Event>> marks;  // per traced step
  std::vector<std::vector<std::pair<runtime::Event, runtime::Event>>> ranges;  // per traced step, as Step::ranges
  runtime::KernelTrace kernels;  // CUPTI's kernel records from the first traced step to the last's end
  bool kernels_on = false;
  uint64_t base_ns = 0;       // CUPTI's clock at t0_
};

std::pair<int64_t, int64_t> StepTrace::parse(const std::string& spec) {
  return parse_step_range(spec, "telemetry.profile_steps");
}

StepTrace::StepTrace(Device device, const std::string& spec, std::filesystem::path out, int rank)
    : device_(device), out_(std::move(out)), rank_(rank), dev_(std::make_unique<Device_>(device)) {
  if (spec.empty()) return;
  std::tie(first_, last_) = parse(spec);
}

StepTrace::~StepTrace() = default;

double StepTrace::us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - t0_).count(); }

void StepTrace::begin_step(int64_t step) {
  active_ = on() && step >= first_ && step <= last_;
  if (!active_) return;
  if (steps_.empty()) {
    t0_ = Clock::now();
    if (device_.is_cuda()) {
      dev_->base = std::make_unique<runtime::Event>(true);
      dev_->base->record(device_);
      dev_->kernels_on = dev_->kernels.start();
      if (dev_->kernels_on) dev_->base_ns = dev_->kernels.now_ns();
    }
  }
  steps_.push_back({step, Clock::now(), {}, {}, {}, {}, {}, {}});
  if (device_.is_cuda()) dev_->marks.emplace_back(), dev_->ranges.emplace_back();
  trace::set_sink(this);
}

void StepTrace::begin_range(const char* name) {
  if (!active_) return;
  Step& s = steps_.back();
  s.open.push_back(s.ranges.size());
  s.ranges.push_back({name, Clock::now(), {}});
  if (device_.is_cuda()) {
    auto& r = dev_->ranges.back();
    r.emplace_back(runtime::Event(true), runtime::Event(true));
    r.back().first.record(device_);
    runtime::range_push(name);
  }
}

void StepTrace::instant(const char* name) {
  if (!active_) return;
  steps_.back().instants.emplace_back(name, Clock::now());
  if (device_.is_cuda()) runtime::mark(name);
}

void StepTrace::end_range() {
  if (!active_ || steps_.back().open.empty()) return;
  Step& s = steps_.back();
  const size_t i = s.open.back();
  s.open.pop_back();
  s.ranges[i].end = Clock::now();
  if (device_.is_cuda()) {
    dev_->ranges.back()[i].second.record(device_);
    runtime::range_pop();
  }
}

void StepTrace::data_done() {
  if (active_) steps_.back().data = Clock::now();
}

void StepTrace::mark(int i) {
  if (!active_ || static_cast<int>(steps_.back().marks.size()) != i || i >= kMarks) return;  // out of order: ignored
  steps_.back().marks.push_back(Clock::now());
  if (device_.is_cuda()) {
    dev_->marks.back().emplace_back(true);
    dev_->marks.back().back().record(device_);
    if (nvtx_open_ > 0) runtime::range_pop(), --nvtx_open_;
    if (i + 1 < kMarks) {
      runtime::range_push((std::string("forge: ") + kPhase[i]).c_str());
      ++nvtx_open_;
    }
  }
}

void StepTrace::end_step() {
  if (!active_) return;
  while (!steps_.back().open.empty()) end_range();
  trace::set_sink(nullptr);
  steps_.back().end = Clock::now();
  if (steps_.back().step == last_ && dev_->kernels_on) dev_->kernels.stop();  // (waits for the device)
  while (nvtx_open_ > 0) runtime::range_pop(), --nvtx_open_;
  active_ = false;
}

std::string StepTrace::write() {
  if (!on() || written_ || steps_.empty()) return "";
  written_ = true;
  using nlohmann::json;
  json events = json::array();
  auto span = [&](const std::string& name, int tid, double ts, double end, const json& args = json::object()) {
    if (end >= ts) events.push_back({{"name", name}, {"ph", "X"}, {"pid", rank_}, {"tid", tid}, {"ts", ts},
                                     {"dur", end - ts}, {"args", args}});
  };
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 1}, {"args", {{"name", "host"}}}});
  for (const auto& s : steps_) {
    const json args = {{"step", s.step}};
    span("step " + std::to_string(s.step), 1, us(s.begin), us(s.end), args);
    if (s.data != Clock::time_point{}) span("data", 1, us(s.begin), us(s.data), args);
    for (size_t i = 0; i + 1 < s.marks.size(); ++i) span(kPhase[i], 1, us(s.marks[i]), us(s.marks[i + 1]), args);
    for (const Range& r : s.ranges) span(r.name, 1, us(r.begin), us(r.end), args);
    for (const auto& [name, at] : s.instants)
      events.push_back({{"name", name}, {"ph", "i"}, {"s", "t"}, {"pid", rank_}, {"tid", 1}, {"ts", us(at)}, {"args", args}});
  }
  if (device_.is_cuda() && dev_->base) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 2}, {"args", {{"name", "GPU compute stream"}}}});
    for (size_t k = 0; k < steps_.size() && k < dev_->marks.size(); ++k) {
      const auto& m = dev_->marks[k];
      if (m.empty()) continue;
      m.back().synchronize();
      const json args = {{"step", steps_[k].step}};
      std::vector<double> t;
      for (const auto& e : m) t.push_back(1e3 * static_cast<double>(dev_->base->elapsed_ms(e)));
      span("step " + std::to_string(steps_[k].step), 2, t.front(), t.back(), args);
      for (size_t i = 0; i + 1 < t.size(); ++i) span(kPhase[i], 2, t[i], t[i + 1], args);
      if (k < dev_->ranges.size())
        for (size_t i = 0; i < dev_->ranges[k].size() && i < steps_[k].ranges.size(); ++i) {
          const auto& [b, e] = dev_->ranges[k][i];
          span(steps_[k].ranges[i].name, 2, 1e3 * static_cast<double>(dev_->base->elapsed_ms(b)),
               1e3 * static_cast<double>(dev_->base->elapsed_ms(e)), args);
        }
    }
  }
  json other = {{"forge", "telemetry.profile_steps"}, {"first_step", first_}, {"last_step", last_}};
  // The kernels (CUPTI), on a track of their own, on the host's clock.
  if (device_.is_cuda()) {
    if (dev_->kernels_on) dev_->kernels.stop();
    if (dev_->kernels_on) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 3}, {"args", {{"name", "GPU kernels (CUPTI)"}}}});
      for (const auto& k : dev_->kernels.records()) {
        if (k.start_ns < dev_->base_ns || k.end_ns < k.start_ns) continue;
        events.push_back({{"name", k.name}, {"ph", "X"}, {"pid", rank_}, {"tid", 3},
                          {"ts", static_cast<double>(k.start_ns - dev_->base_ns) / 1e3},
                          {"dur", static_cast<double>(k.end_ns - k.start_ns) / 1e3}, {"args", {{"stream", k.stream}}}});
      }
      other["kernels"] = dev_->kernels.records().size();
    } else {
      other["kernels"] = dev_->kernels.note();
    }
  }
  const json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", other}};
  io::write_file_atomic(out_, trace.dump() + "\n");
  return out_.string();
}

}  // namespace forge::train
