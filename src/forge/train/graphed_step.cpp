// The training step as a CUDA graph: Note [the step as a CUDA graph] in graphed_step.h.
#include "forge/train/graphed_step.h"

#include <ostream>
#include <sstream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/shape.h"
#include "forge/ops/copy.h"

namespace forge::train {

namespace {

bool same_shapes(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].inputs.shape() != b[k].inputs.shape() || a[k].targets.shape() != b[k].targets.shape() ||
        a[k].inputs.dtype() != b[k].inputs.dtype() || a[k].targets.dtype() != b[k].targets.dtype() ||
        a[k].documents.defined() != b[k].documents.defined())
      return false;
  return true;
}

std::string shapes_of(const std::vector<data::Batch>& mbs) {
  std::ostringstream o;
  o << mbs.size() << " x " << shape_str(mbs.empty() ? Shape{} : mbs[0].inputs.shape());
  return o.str();
}

}  // namespace

std::string graph_blocker(const RunConfig& cfg, Device device, bool phases_on) {
  if (!device.is_cuda()) return "not a GPU";
  if (!cfg.run.cuda_graph) return "run.cuda_graph = false";
  if (std::string why; !runtime::graph_capture_supported(device, &why)) return why;
  if (cfg.model.dropout > 0)
    return "model.dropout > 0 draws a new random seed on the host at every call, which a replay would repeat";
  if (cfg.dist.grad_compression != "none")
    return "dist.grad_compression = \"" + cfg.dist.grad_compression +
           "\" replaces its state tensors at every step, which a replay would not";
  if (cfg.dist.link_gbps > 0)
    return "dist.link_gbps paces the simulated network with host callbacks that hold their own times";
  if (phases_on) return "FORGE_TRAIN_PHASES times the step's phases with events the host reads";
  // (Packed documents and chat masks weigh micro-batches by their counted targets: in a replay
  // those weights come from the static batches on the device, Note [token weights on the device].)
  return "";
}

GraphedStep::GraphedStep(Strategy& strategy, const RunConfig& cfg, Device device, bool phases_on, std::ostream& log)
    : strategy_(strategy), device_(device), log_(log) {
  if (!device.is_cuda()) return;
  std::string why = graph_blocker(cfg, device, phases_on);
  if (why.empty()) why = strategy.graph_blocker();
  if (!why.empty()) {
    log << "cuda graph: off (" << why << "); every step is launched kernel by kernel\n";
    return;
  }
  graph_ = std::make_unique<runtime::StepGraph>(device);  // (waits once for the work queued before)
  enabled_ = true;
  log << "cuda graph: on: step 1 runs kernel by kernel (tuning, plans, optimizer state), step 2 is captured and "
         "replayed from then on (run.cuda_graph)\n";
}

GraphedStep::~GraphedStep() {
  if (!graph_) return;
  figures_ = Tensor();
  static_batches_.clear();
  graph_.reset();  // waits for the last replay; the previous current stream again; the pool freed
}

Tensor GraphedStep::train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases,
                               bool traced) {
  if (!enabled_) return strategy_.train_step(micro_batches, lr, phases);
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
  if (!graph_->captured()) {
    static_batches_.clear();
    for (const data::Batch& b : micro_batches)
      static_batches_.push_back(b.map([&](const Tensor& t) { return t.pin_memory().to(device_, /*non_blocking=*/true); }));
    // The warm-up step's cached blocks back to the device: the graph's pool needs the room.
    runtime::empty_cache(device_);
    strategy_.begin_graph_capture();
    graph_->capture_begin();
    try {
      figures_ = strategy_.train_step(static_batches_, lr, phases);
    } catch (const std::exception& e) {
      graph_->capture_abort();
      strategy_.end_graph_capture();
      FORGE_THROW("cuda graph: capturing the training step failed: ", e.what(),
                  "; this is a gap in forge's CUDA graph support: set run.cuda_graph = false to train without graphs");
    }
    try {
      graph_->capture_end();
    } catch (const std::exception& e) {
      strategy_.end_graph_capture();
      FORGE_THROW(e.what(), "; set run.cuda_graph = false to train without graphs");
    }
    strategy_.end_graph_capture();  // also queues this step's lr and step counts
    nodes_ = graph_->num_nodes();
    capture_at_ = call;
    graph_->replay();
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
      data::Batch& s = static_batches_[k];
      const data::Batch& b = micro_batches[k];
      for (auto [to, from] : {std::pair{&s.inputs, &b.inputs}, std::pair{&s.targets, &b.targets},
                              std::pair{&s.documents, &b.documents}, std::pair{&s.positions, &b.positions}})
        if (to->defined()) ops::copy_(*to, from->pin_memory(), /*non_blocking=*/true);
    }
  }
  strategy_.before_replay(lr);
  graph_->replay();
  strategy_.after_replay_launched();
  ++replays_;
  return figures_;
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
