#pragma once
// telemetry.profile_steps = "A:B": a Chrome / Perfetto trace of training steps A..B (1-based,
// inclusive) per rank, with no profiler installed: <run dir>/trace.rank<r>.json, opened by
// https://ui.perfetto.dev or chrome://tracing.
//
// Note [step trace]: the host track has, per traced step, the step's span, the time spent getting
// its micro-batches ("data") and the phases between the strategy's marks (train/phase_marks.h:
// forward and backward of the last micro-batch, waiting for the gradient reductions, loss/norm/
// clip, update), in host time: on a CPU that is the work itself, on a GPU the time the host
// spent queueing it. Inside the phases, the ranges of core/trace_range.h: each transformer block's
// forward and backward ("forward: block i", "backward: block i") and the optimizer's update.
// On a GPU a second track has the same phases and ranges in device time, from CUDA events
// recorded at the marks on the compute stream and placed on the host clock at the first traced
// step (so the GPU track lags the host track by the queue's depth). The same phases are NVTX
// ranges ("forge: forward", ...) while tracing, so an Nsight Systems timeline reads the same way.
// A third track has the GPU's kernels themselves, from CUPTI's activity records (loaded at run time
// from the CUDA toolkit: backends/cuda/kernel_trace.h; without it the file says why in
// otherData.kernels), from the first traced step to the end of the last (the device is waited
// for there, once). A run whose step is a CUDA graph runs the traced steps kernel by kernel
// (GraphedStep), since a replay's phases cannot be told apart.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/device.h"
#include "forge/core/trace_range.h"

namespace forge::train {

// While a traced step runs, the trace is the thread's trace::RangeSink: the blocks' forward and
// backward ranges and the optimizer's (core/trace_range.h) go on both tracks, nested in the phases.
class StepTrace : public trace::RangeSink {
 public:
  // spec "A:B" ("" = off; checked by the config); out: the file to write.
  StepTrace(Device device, const std::string& spec, std::filesystem::path out, int rank);
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  bool on() const { return first_ > 0; }
  bool tracing() const { return active_; }  // the step begun last is traced
  void begin_step(int64_t step);  // before step `step`'s micro-batches are fetched
  void data_done();               // they are in hand
  void mark(int i);               // a phase mark (PhaseMarks::mark forwards it)
  void end_step();                // the step is queued (the host's part is done)
  void begin_range(const char* name) override;
  void end_range() override;
  void instant(const char* name) override;
  // Writes the trace (after the last traced step; later calls do nothing). Returns the path, or "".
  std::string write();

  // "A:B" -> {A, B}; throws forge::Error naming telemetry.profile_steps and the fix.
  static std::pair<int64_t, int64_t> parse(const std::string& spec);

 private:
  using Clock = std::chrono::steady_clock;
  struct Range {
    const char* name = nullptr;
    Clock::time_point begin, end;
  };
  struct Step {
    int64_t step = 0;
    Clock::time_point begin, data, end;
    std::vector<Clock::time_point> marks;  // host time at each mark
    std::vector<Range> ranges;             // in the order they began
    std::vector<size_t> open;              // indices of the ranges not ended yet
    std::vector<std::pair<const char*, Clock::time_point>> instants;
  };
  struct Device_;  // the CUDA events (GPU runs)
  double us(Clock::time_point t) const;
  Device device_;
  int64_t first_ = 0, last_ = 0;
  std::filesystem::path out_;
  int rank_ = 0;
  bool active_ = false, written_ = false;
  int nvtx_open_ = 0;
  Clock::time_point t0_;
  std::vector<Step> steps_;
  std::unique_ptr<Device_> dev_;
};

}  // namespace forge::train
