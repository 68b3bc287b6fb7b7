#pragma once
// PhaseMarks: FORGE_TRAIN_PHASES=1 (a diagnostic, docs/train.md): timing events on the compute
// stream at the phase boundaries of every step; at the end each rank prints the mean device time
// of each phase over the steps after the first ten. The marks are where the GPU reaches them, so
// a phase's time includes any wait for the host or for another stream (the gradient reductions)
// within it. A step's events are folded into running sums once the next step has begun (its
// figures have been read by then, so they are complete): a long run holds a few events only.
// CUDA only; on a CPU device every call does nothing.
//
// The marks a strategy's step sets (train/strategy.h): 0 before the last micro-batch's forward,
// 1 before its backward, 2 after it, 3 once the gradient reductions are waited for, 4 before the
// update, 5 after it.
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "forge/core/device.h"

namespace forge::train {

class PhaseMarks {
 public:
  static constexpr int kMarks = 6;  // forward | backward | reductions | loss, norm, clip | update | (next step)
  // on: FORGE_TRAIN_PHASES=1.
  PhaseMarks(Device device, bool on);
  ~PhaseMarks();
  PhaseMarks(const PhaseMarks&) = delete;
  PhaseMarks& operator=(const PhaseMarks&) = delete;
  // Mark i of the current step (0 starts a step); a mark out of order is ignored.
  void mark(int i);
  // telemetry.profile_steps: every mark also goes to this trace (train/step_trace.h), on any device.
  void set_trace(class StepTrace* trace) { trace_ = trace; }
  // Host seconds spent waiting for a step's figures (the host's slack: near 0, it is the bottleneck).
  void host_waited(double seconds) { waited_ += seconds; }
  bool on() const { return on_; }
  // The report line (empty when off or too few steps).
  std::string report();

 private:
  static constexpr int64_t kFirst = 10;  // warm-up steps left out
  struct Events;                         // the CUDA events of the steps not folded yet
  // Adds every step but the last `keep` to the sums (a step needs the next one's first mark).
  void fold(size_t keep);
  std::unique_ptr<Events> events_;
  class StepTrace* trace_ = nullptr;
  Device device_;
  bool on_ = false;
  int64_t started_ = 0;
  double waited_ = 0.0;
  int64_t allocs0_ = 0;
  std::array<double, kMarks> sum_{};
  int64_t n_ = 0;
};

}  // namespace forge::train
