// The training step as a CUDA graph: Note [the step as a CUDA graph] in graphed_step.h.
#include "forge/train/graphed_step.h"

#include <optional>
#include <ostream>
#include <sstream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/shape.h"
#include "forge/ops/copy.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#endif

namespace forge::train {

namespace {

[[maybe_unused]] bool same_shapes(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].inputs.shape() != b[k].inputs.shape() || a[k].targets.shape() != b[k].targets.shape() ||
        a[k].inputs.dtype() != b[k].inputs.dtype() || a[k].targets.dtype() != b[k].targets.dtype())
      return false;
  return true;
}

[[maybe_unused]] std::string shapes_of(const std::vector<data::Batch>& mbs) {
  std::ostringstream o;
  o << mbs.size() << " x " << shape_str(mbs.empty() ? Shape{} : mbs[0].inputs.shape());
  return o.str();
}

}  // namespace

std::string graph_blocker(const RunConfig& cfg, Device device, bool phases_on) {
  if (!device.is_cuda()) return "not a GPU";
  if (!cfg.run.cuda_graph) return "run.cuda_graph = false";
#ifdef FORGE_WITH_CUDA
  if (!cuda::caching_allocator_enabled()) return "FORGE_CUDA_ALLOC=plain frees memory with cudaFree, which a capture cannot";
#endif
  if (cfg.model.dropout > 0)
    return "model.dropout > 0 draws a new random seed on the host at every call, which a replay would repeat";
  if (phases_on) return "FORGE_TRAIN_PHASES times the step's phases with events the host reads";
  return "";
}

#ifdef FORGE_WITH_CUDA
struct GraphedStep::Cuda {
  cuda::Stream stream;
  std::optional<cuda::StreamGuard> guard;
  std::unique_ptr<cuda::CudaGraph> graph;
  explicit Cuda(int device) : stream(cuda::Stream::create(device)) {}
};
#else
struct GraphedStep::Cuda {};
#endif

GraphedStep::GraphedStep(Strategy& strategy, const RunConfig& cfg, Device device, bool phases_on, std::ostream& log)
    : strategy_(strategy), device_(device), log_(log) {
  if (!device.is_cuda()) return;
  std::string why = graph_blocker(cfg, device, phases_on);
  if (why.empty()) why = strategy.graph_blocker();
  if (!why.empty()) {
    log << "cuda graph: off (" << why << "); every step is launched kernel by kernel\n";
    return;
  }
#ifdef FORGE_WITH_CUDA
  const int d = static_cast<int>(device.index);
  cuda_ = std::make_unique<Cuda>(d);
  // The new stream does not wait for the legacy stream's work (the model's upload, DDP's
  // broadcast): wait for it here, once.
  cuda::synchronize(d);
  cuda_->guard.emplace(cuda_->stream);
  enabled_ = true;
  log << "cuda graph: on: step 1 runs kernel by kernel (tuning, plans, optimizer state), step 2 is captured and "
         "replayed from then on (run.cuda_graph)\n";
#endif
}

GraphedStep::~GraphedStep() {
#ifdef FORGE_WITH_CUDA
  if (cuda_) {
    try {
      cuda_->stream.synchronize();
    } catch (...) {
    }
    cuda_->guard.reset();  // the previous current stream again; the graph and its pool go with cuda_
    figures_ = Tensor();
    static_batches_.clear();
  }
#endif
}

Tensor GraphedStep::train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases,
                               bool traced) {
  if (!enabled_) return strategy_.train_step(micro_batches, lr, phases);
#ifdef FORGE_WITH_CUDA
  const int64_t call = replays_ + eager_ + 1;
  if (traced && call > 1) {
    if (traced_++ == 0)
      log_ << "cuda graph: step " << call << " and the other steps of telemetry.profile_steps run kernel by kernel, "
           << "so the trace times their phases (counted at the end)" << std::endl;
    ++eager_;
    return strategy_.train_step(micro_batches, lr, phases);
  }
  // 1. Warm-up: everything lazy happens outside any capture.
  if (call == 1) {
    ++eager_;
    return strategy_.train_step(micro_batches, lr, phases);
  }
  // 2. Capture at the second step.
  if (!cuda_->graph) {
    static_batches_.clear();
    for (const data::Batch& b : micro_batches) {
      data::Batch s;
      s.inputs = b.inputs.pin_memory().to(device_, /*non_blocking=*/true);
      s.targets = b.targets.pin_memory().to(device_, /*non_blocking=*/true);
      static_batches_.push_back(std::move(s));
    }
    // The warm-up step's cached blocks back to the device: the graph's pool needs the room.
    cuda::empty_cache(static_cast<int>(device_.index));
    auto graph = std::make_unique<cuda::CudaGraph>();
    strategy_.begin_graph_capture();
    graph->capture_begin(cuda_->stream);
    try {
      figures_ = strategy_.train_step(static_batches_, lr, phases);
    } catch (const std::exception& e) {
      graph->capture_abort();
      strategy_.end_graph_capture();
      FORGE_THROW("cuda graph: capturing the training step failed: ", e.what(),
                  "; this is a gap in forge's CUDA graph support: set run.cuda_graph = false to train without graphs");
    }
    try {
      graph->capture_end();
    } catch (const std::exception& e) {
      strategy_.end_graph_capture();
      FORGE_THROW(e.what(), "; set run.cuda_graph = false to train without graphs");
    }
    strategy_.end_graph_capture();  // also queues this step's lr and step counts
    nodes_ = graph->num_nodes();
    capture_at_ = call;
    cuda_->graph = std::move(graph);
    cuda_->graph->replay();
    strategy_.after_replay_launched();
    ++replays_;
    log_ << "cuda graph: step " << call << " captured (" << nodes_ << " nodes; " << shapes_of(micro_batches)
         << " micro-batches) and launched; replayed from now on" << std::endl;
    return figures_;
  }
  // 3. Replays; a batch of another shape runs without the graph.
  if (!same_shapes(micro_batches, static_batches_)) {
    if (reshaped_++ == 0)
      log_ << "cuda graph: step " << call << "'s micro-batches (" << shapes_of(micro_batches)
           << ") differ from the captured step's (" << shapes_of(static_batches_)
           << "): such steps run without the graph (counted at the end)" << std::endl;
    ++eager_;
    return strategy_.train_step(micro_batches, lr, phases);
  }
  {
    NoGradGuard no_grad;
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      ops::copy_(static_batches_[k].inputs, micro_batches[k].inputs.pin_memory(), /*non_blocking=*/true);
      ops::copy_(static_batches_[k].targets, micro_batches[k].targets.pin_memory(), /*non_blocking=*/true);
    }
  }
  strategy_.before_replay(lr);
  cuda_->graph->replay();
  strategy_.after_replay_launched();
  ++replays_;
  return figures_;
#else
  (void)lr;
  (void)phases;
  (void)micro_batches;
  (void)traced;
  FORGE_THROW("GraphedStep: CUDA graphs need a CUDA build");
#endif
}

std::string GraphedStep::summary() const {
  if (!enabled_) return "";
  std::ostringstream o;
  o << "cuda graph: " << replays_ << " step(s) replayed from the graph of step " << capture_at_ << " (" << nodes_
    << " nodes), " << eager_ << " without it (1 warm-up";
  if (reshaped_ > 0) o << ", " << reshaped_ << " with micro-batches of another shape";
  if (traced_ > 0) o << ", " << traced_ << " traced";
  o << ")";
  return o.str();
}

}  // namespace forge::train
