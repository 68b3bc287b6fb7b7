#pragma once
// GraphedStep: the training step as a CUDA graph (run.cuda_graph, docs/train.md).
//
//   GraphedStep graphed(*strategy, cfg, device, log);   // says in the log whether it captures
//   for each step:
//     Tensor figures = graphed.train_step(micro_batches, lr, phases);   // as Strategy::train_step
//
// Note [the step as a CUDA graph]
// -------------------------------
// A GPT-2 124M step is about 510 kernels; launching them costs the host more than the GPU spends
// on some of them, and the gaps add up (0.8 ms of a 31 ms step on an H200, docs/performance.md).
// A CUDA graph launches the whole step at once. The steady state already asks nothing of the
// host (Note [one sync per step], Note [deferred step read]), so the step is captured whole:
// forward, backward, the data-parallel gradient all-reduces (NCCL collectives are captured on
// their stream, joined to the step's through events), the norm, clipping, the skip flag and
// the update.
//   1. While capturing is possible, the run's CUDA work goes to a stream of its own (the legacy
//      default stream cannot be captured), made current for the whole loop.
//   2. Step 1 runs as usual: GEMM tuning, cuDNN's attention plans, NCCL's connections, the
//      optimizer's state and the allocator's growth all happen here, never in a capture.
//   3. Step 2 copies its micro-batches into device tensors kept for the graph, gives the main
//      pool's cached memory back (empty_cache), and captures Strategy::train_step on them (every
//      allocation from the graph's private pool, Note [graph memory pools]); then launches it.
//      The optimizer reads its lr and step counts from the device from then on (Note [optimizer
//      steps in a CUDA graph]); the step's figures tensor is the graph's, at a fixed address.
//   4. Every later step copies its batch into those tensors, lets the strategy account for the
//      replayed step on the host (step counts, lr) and launches the graph: one launch, no
//      allocation, no host synchronisation. The figures are read one step late as before.
// A step whose micro-batches differ in shape or number from the captured ones (the last batch
// of an image epoch) runs without the graph (eager), said in the log the first time; both
// paths keep the same state, so they mix freely. Nothing is captured (everything runs as
// before, on the legacy stream) when the log's "cuda graph: off" line names a reason:
// run.cuda_graph = false, dropout > 0 (its random seeds are drawn on the host per call),
// FORGE_TRAIN_PHASES (its timing events need the host), FORGE_CUDA_ALLOC=plain (cudaFree in a
// capture), or a layout whose step is not captured yet (Strategy::graph_blocker: ZeRO). A
// capture that fails anyway is an error that says so and how to turn graphs off.
// Results: a replay runs the captured kernels with the same arguments (the lr and step
// counts, read from the device, have the values the host would pass), so a run with graphs
// gives the same bits as one without (tests/cuda/test_cuda_graph.cpp).
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "forge/backends/device_runtime.h"
#include "forge/core/device.h"
#include "forge/core/tensor.h"
#include "forge/data/loader.h"
#include "forge/run/config.h"
#include "forge/train/phase_marks.h"
#include "forge/train/strategy.h"

namespace forge::train {

// Why the step of `cfg` on `device` is not captured ("" when it is), before the strategy's own
// reason (Strategy::graph_blocker). "" on a CPU is never asked: there is nothing to capture.
std::string graph_blocker(const RunConfig& cfg, Device device, bool phases_on);

class GraphedStep {
 public:
  // Logs one "cuda graph: ..." line on a GPU (nothing on a CPU).
  GraphedStep(Strategy& strategy, const RunConfig& cfg, Device device, bool phases_on, std::ostream& log);
  // Waits for the step's stream and restores the thread's previous current stream.
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // Strategy::train_step, captured and replayed as described above. traced: the step is in
  // telemetry.profile_steps and runs kernel by kernel (a replay has no phases to time: its marks
  // would all fall at the one launch); said in the log the first time.
  Tensor train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases,
                    bool traced = false);

  bool enabled() const { return enabled_; }
  // Steps launched as replays, and steps run without the graph (the first, and any with another shape).
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_; }
  // The end-of-run line ("cuda graph: N steps replayed, ..."), empty when off.
  std::string summary() const;

 private:
  Strategy& strategy_;
  Device device_;
  std::ostream& log_;
  bool enabled_ = false;
  std::unique_ptr<runtime::StepGraph> graph_;  // its stream is current while it lives; captured at step 2
  std::vector<data::Batch> static_batches_;  // the captured step's micro-batches, on the GPU
  Tensor figures_;                           // the captured step's figures
  int64_t replays_ = 0, eager_ = 0, reshaped_ = 0, traced_ = 0;
  size_t nodes_ = 0;
  int64_t capture_at_ = 0;  // the call that captured (1-based)
};

}  // namespace forge::train
