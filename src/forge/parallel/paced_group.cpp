// Operations held to a simulated link's rate (Note [paced link] in paced_group.h).
#include "forge/parallel/paced_group.h"

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>

#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"

namespace forge::parallel {

using Clock = std::chrono::steady_clock;

double paced_seconds(const LinkPace& pace, double bytes, int steps) {
  FORGE_CHECK(pace.gbps > 0, "paced_seconds: the link rate must be > 0");
  return std::max(pace.share, 1) * bytes * 8.0 / (pace.gbps * 1e9) + std::max(steps, 0) * pace.latency_us * 1e-6;
}

namespace {

// When one direction of the link is free again: shared by the operations (and, on a GPU, the host
// callbacks) of the groups that use it.
struct LinkState {
  std::mutex mu;
  Clock::time_point free_at{};
  // Reserves the link for `seconds` from max(now, free_at); returns the end.
  Clock::time_point reserve(double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    const Clock::time_point start = std::max(Clock::now(), free_at);
    free_at = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return free_at;
  }
};

}  // namespace

struct LinkClock {
  std::shared_ptr<LinkState> out = std::make_shared<LinkState>(), in = std::make_shared<LinkState>();
};
std::shared_ptr<LinkClock> new_link_clock() { return std::make_shared<LinkClock>(); }

namespace {

// CPU: the inner operation, held until its paced end.
class PacedCpuWork final : public Work {
 public:
  PacedCpuWork(WorkPtr inner, Clock::time_point end) : inner_(std::move(inner)), end_(end) {}
  void wait() override {
    inner_->wait();
    std::this_thread::sleep_until(end_);
  }
  void synchronize() override {
    inner_->synchronize();
    std::this_thread::sleep_until(end_);
  }
  bool is_completed() override { return Clock::now() >= end_ && inner_->is_completed(); }

 private:
  WorkPtr inner_;
  Clock::time_point end_;
};

// GPU: the operation and its pacing queued on the group's side stream; an event marks the end.
class PacedGpuWork final : public Work {
 public:
  PacedGpuWork(WorkPtr inner, runtime::Event end, Device d) : inner_(std::move(inner)), end_(std::move(end)), device_(d) {}
  void wait() override { end_.block_current(device_); }
  void synchronize() override {
    end_.synchronize();
    inner_->synchronize();
  }
  bool is_completed() override { return end_.query(); }

 private:
  WorkPtr inner_;
  runtime::Event end_;
  Device device_;
};

class PacedGroup final : public ProcessGroup {
 public:
  PacedGroup(ProcessGroupPtr inner, LinkPace pace)
      : ProcessGroup(inner->rank(), inner->size()),
        inner_(std::move(inner)),
        pace_(pace),
        clock_(pace_.clock ? pace_.clock : new_link_clock()),
        link_(clock_->out),
        inbound_(clock_->in) {
    if (inner_->device().is_cuda()) side_ = std::make_unique<runtime::SideStream>(inner_->device());
  }

  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    return paced(ring(t.nbytes(), 2), 2 * (size() - 1), [&] { return inner_->all_reduce(t, op); });
  }
  WorkPtr reduce(const Tensor& t, int root, ReduceOp op) override {
    return paced(static_cast<double>(t.nbytes()), size() - 1, [&] { return inner_->reduce(t, root, op); });
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    return paced(static_cast<double>(t.nbytes()), size() - 1, [&] { return inner_->broadcast(t, root); });
  }
  WorkPtr all_gather(const Tensor& o, const Tensor& i) override {
    return paced(ring(o.nbytes(), 1), size() - 1, [&] { return inner_->all_gather(o, i); });
  }
  WorkPtr reduce_scatter(const Tensor& o, const Tensor& i, ReduceOp op) override {
    return paced(ring(i.nbytes(), 1), size() - 1, [&] { return inner_->reduce_scatter(o, i, op); });
  }
  WorkPtr gather(const Tensor& o, const Tensor& i, int root) override {
    return paced(static_cast<double>(i.nbytes()), 1, [&] { return inner_->gather(o, i, root); });
  }
  WorkPtr scatter(const Tensor& o, const Tensor& i, int root) override {
    return paced(static_cast<double>(o.nbytes()), 1, [&] { return inner_->scatter(o, i, root); });
  }
  WorkPtr all_to_all(const Tensor& o, const Tensor& i) override {
    return paced(ring(i.nbytes(), 1), size() - 1, [&] { return inner_->all_to_all(o, i); });
  }
  WorkPtr send(const Tensor& t, int dst, int tag) override {
    return paced(static_cast<double>(t.nbytes()), 1, [&] { return inner_->send(t, dst, tag); });
  }
  WorkPtr recv(const Tensor& t, int src, int tag) override {  // (arrives no earlier than the link brings it)
    return paced(static_cast<double>(t.nbytes()), 1, [&] { return inner_->recv(t, src, tag); }, inbound_);
  }
  WorkPtr barrier() override { return paced(0, size() - 1, [&] { return inner_->barrier(); }); }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override { return inner_->new_group(ranks); }
  void watch_replayed_work(const char* what) override { inner_->watch_replayed_work(what); }

 private:
  // The bytes each rank sends in a ring over this group: factor x (n-1)/n of `bytes`.
  double ring(size_t bytes, int factor) const {
    return factor * static_cast<double>(bytes) * (size() - 1) / std::max(size(), 1);
  }

  // `link`: the outbound direction (sends and collectives) unless given; the inbound one for recv
  // (a full-duplex link: what a rank receives does not queue behind what it sends).
  template <class Start> WorkPtr paced(double bytes, int steps, Start&& start, std::shared_ptr<LinkState> link = nullptr) {
    if (!link) link = link_;
    const double seconds = paced_seconds(pace_, bytes, steps);
    if (!side_) {
      const Clock::time_point end = link->reserve(seconds);
      return std::make_shared<PacedCpuWork>(start(), end);
    }
    // GPU: [stamp: reserve the link when the device reaches the operation] -> the operation ->
    // [sleep until the reserved end]. The driver runs host callbacks in order, one at a time.
    auto end = std::make_shared<Clock::time_point>();
    side_->enter();
    WorkPtr w;
    runtime::Event done;
    try {
      side_->host_call([end, link, seconds] { *end = link->reserve(seconds); });
      w = start();
      w->wait();  // (the side stream waits for the operation)
      side_->host_call([end] { std::this_thread::sleep_until(*end); });
      done.record(device());
    } catch (...) {
      side_->leave();
      throw;
    }
    side_->leave();
    return std::make_shared<PacedGpuWork>(std::move(w), std::move(done), device());
  }

  ProcessGroupPtr inner_;
  LinkPace pace_;
  std::shared_ptr<LinkClock> clock_;
  std::shared_ptr<LinkState> link_, inbound_;
  std::unique_ptr<runtime::SideStream> side_;
};

}  // namespace

ProcessGroupPtr make_paced(const ProcessGroupPtr& inner, const LinkPace& pace) {
  FORGE_CHECK(inner != nullptr, "make_paced: no group");
  if (pace.gbps <= 0) return inner;
  FORGE_CHECK(pace.latency_us >= 0 && pace.share >= 1, "make_paced: latency must be >= 0 and share >= 1");
  return std::make_shared<PacedGroup>(inner, pace);
}

}  // namespace forge::parallel
