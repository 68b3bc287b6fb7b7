// Stages run as one Work (chain_work.h).
#include "forge/parallel/chain_work.h"

#include <memory>
#include <utility>

#include "forge/autograd/grad_mode.h"

namespace forge::parallel {

namespace {

// The stages of one hierarchical operation, one after another. CPU: the first starts at the call,
// each next one when the previous is done, as wait() / synchronize() / is_completed() find it (on
// the calling thread: MPI is funnelled). GPU: every stage queued at the call on the group's side
// stream (each collective's Work waited there, a stream wait), the end marked by an event.
class ChainWork final : public Work {
 public:
  ChainWork(std::vector<Stage> stages, runtime::SideStream* side, std::vector<Tensor> keep)
      : stages_(std::move(stages)), keep_(std::move(keep)) {
    if (side == nullptr) {
      advance(false);
      return;
    }
    device_ = side->device();
    side->enter();
    try {
      NoGradGuard no_grad;
      for (auto& s : stages_)
        if (WorkPtr w = s()) {
          w->wait();
          inner_.push_back(std::move(w));
        }
      for (const Tensor& t : keep_) side->keep(t);
      end_.record(device_);
    } catch (...) {
      side->leave();
      throw;
    }
    side->leave();
    next_ = stages_.size();
  }

  // CPU: the stages not started yet are collectives the other ranks wait for: run them. (GPU:
  // everything is queued already; the host never waits here, the groups keep their tensors.)
  ~ChainWork() override {
    if (device_.is_cuda()) return;
    try {
      advance(true);
    } catch (...) {
    }
  }

  void wait() override {
    if (device_.is_cuda()) end_.block_current(device_);
    else advance(true);
  }
  void synchronize() override {
    if (device_.is_cuda()) {
      end_.synchronize();
      for (auto& w : inner_) w->synchronize();
      inner_.clear();
      keep_.clear();
    } else {
      advance(true);
    }
  }
  bool is_completed() override { return device_.is_cuda() ? end_.query() : advance(false); }

 private:
  // CPU: runs the chain as far as it can (block: to its end). True when it is done.
  bool advance(bool block) {
    NoGradGuard no_grad;
    while (true) {
      if (current_) {
        if (!block && !current_->is_completed()) return false;
        current_->wait();  // (an MPI work's host part: avg's division, 16-bit results rounded back)
        current_ = nullptr;
      }
      if (next_ >= stages_.size()) break;
      current_ = stages_[next_++]();
    }
    keep_.clear();
    return true;
  }

  std::vector<Stage> stages_;
  std::vector<Tensor> keep_;
  size_t next_ = 0;
  WorkPtr current_;
  Device device_ = Device::cpu();
  runtime::Event end_;
  std::vector<WorkPtr> inner_;
};

}  // namespace

WorkPtr chain_work(std::vector<Stage> stages, runtime::SideStream* side, std::vector<Tensor> keep) {
  return std::make_shared<ChainWork>(std::move(stages), side, std::move(keep));
}

}  // namespace forge::parallel
