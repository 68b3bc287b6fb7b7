// A process group of one rank without an engine (contract in self_group.h).
#include "forge/parallel/self_group.h"

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/copy.h"

namespace forge::parallel {

namespace {

class SelfGroup final : public ProcessGroup {
 public:
  explicit SelfGroup(Device device) : ProcessGroup(0, 1), device_(device) {}
  std::string backend() const override { return "self"; }
  Device device() const override { return device_; }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    detail::check_tensor(*this, "all_reduce", "t", t);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    return done();  // avg divides by 1
  }
  WorkPtr reduce(const Tensor& t, int root, ReduceOp op) override {
    detail::check_rank(*this, "reduce", "root", root);
    detail::check_tensor(*this, "reduce", "t", t);
    detail::check_reduce_op("reduce", op, t.dtype());
    return done();
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    detail::check_rank(*this, "broadcast", "root", root);
    detail::check_tensor(*this, "broadcast", "t", t);
    return done();
  }
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    detail::check_all_gather(*this, output, input);
    return copy(output, input);
  }
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_reduce_scatter(*this, output, input, op);
    return copy(output, input);
  }
  WorkPtr gather(const Tensor& output, const Tensor& input, int root) override {
    detail::check_gather(*this, output, input, root);
    return copy(output, input);
  }
  WorkPtr scatter(const Tensor& output, const Tensor& input, int root) override {
    detail::check_scatter(*this, output, input, root);
    return copy(output, input);
  }
  WorkPtr all_to_all(const Tensor& output, const Tensor& input) override {
    detail::check_all_to_all(*this, output, input);
    return copy(output, input);
  }
  WorkPtr send(const Tensor& t, int dst, int) override {
    detail::check_peer(*this, "send", "dst", dst);  // always throws: the only rank is this one
    detail::check_tensor(*this, "send", "t", t);
    return done();
  }
  WorkPtr recv(const Tensor& t, int src, int) override {
    detail::check_peer(*this, "recv", "src", src);
    detail::check_tensor(*this, "recv", "t", t);
    return done();
  }
  WorkPtr barrier() override { return done(); }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    detail::check_group_ranks(*this, ranks);
    return std::make_shared<SelfGroup>(device_);
  }

 private:
  static WorkPtr done() { return completed_work(); }
  static WorkPtr copy(const Tensor& output, const Tensor& input) {
    if (output.data_ptr() != input.data_ptr()) {
      NoGradGuard ng;
      Tensor out = output.detach().reshape({output.numel()});
      ops::copy_(out, input.detach().reshape({input.numel()}));
    }
    return done();
  }
  Device device_;
};

}  // namespace

ProcessGroupPtr self_group(Device device) { return std::make_shared<SelfGroup>(device); }

}  // namespace forge::parallel
