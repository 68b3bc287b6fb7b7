// Reductions within each node first (Note [hierarchical data-parallel reduction] in
// hierarchical_group.h).
#include "forge/parallel/hierarchical_group.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/parallel/chain_work.h"

namespace forge::parallel {

namespace {

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(ProcessGroupPtr flat, ProcessGroupPtr intra, ProcessGroupPtr inter, int per_node)
      : ProcessGroup(flat->rank(), flat->size()),
        flat_(std::move(flat)),
        intra_(std::move(intra)),
        inter_(std::move(inter)),
        k_(per_node),
        nodes_(size() / per_node),
        local_(rank() % per_node) {
    if (flat_->device().is_cuda()) side_ = std::make_unique<runtime::SideStream>(flat_->device());
  }

  std::string backend() const override { return flat_->backend(); }
  Device device() const override { return flat_->device(); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    detail::check_tensor(*this, "all_reduce", "t", t);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    const int64_t n = t.numel();
    if (n < k_) return flat_->all_reduce(t, op);  // nothing to split
    const int64_t s = (n + k_ - 1) / k_, padded = s * k_;
    auto buf = std::make_shared<Tensor>();
    const Tensor flat_t = t.view({n});
    std::vector<Stage> stages;
    stages.push_back([=, this] {
      if (padded == n) {
        *buf = flat_t;
      } else {  // k slices of s: a copy padded with zeros (sum, avg, max, min: the padding is never read back)
        *buf = zeros({padded}, {.dtype = t.dtype(), .device = device()});
        buf->narrow(0, 0, n).copy_(flat_t);
      }
      return intra_->reduce_scatter(buf->narrow(0, local_ * s, s), *buf, op);
    });
    stages.push_back([=, this] { return inter_->all_reduce(buf->narrow(0, local_ * s, s), op); });
    stages.push_back([=, this] { return intra_->all_gather(*buf, buf->narrow(0, local_ * s, s)); });
    if (padded != n)
      stages.push_back([=]() -> WorkPtr {
        Tensor dst = flat_t;
        ops::copy_as_communication_(dst, buf->narrow(0, 0, n));
        *buf = Tensor();
        return nullptr;
      });
    return chain_work(std::move(stages), side_.get(), {t});
  }

  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_reduce_scatter(*this, output, input, op);
    const int64_t s = output.numel();
    if (s == 0) return flat_->reduce_scatter(output, input, op);
    auto mid = std::make_shared<Tensor>();
    std::vector<Stage> stages;
    stages.push_back([=, this] {
      // Slices (node, local) -> (local, node): this rank's local index then holds every node's slice of it.
      const Tensor local_major = input.view({nodes_, k_, s}).transpose(0, 1).contiguous().view({size() * s});
      *mid = empty({nodes_ * s}, {.dtype = input.dtype(), .device = device()});
      return intra_->reduce_scatter(*mid, local_major, op);
    });
    stages.push_back([=, this] { return inter_->reduce_scatter(output, *mid, op); });
    return chain_work(std::move(stages), side_.get(), {output, input});
  }

  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    detail::check_all_gather(*this, output, input);
    const int64_t s = input.numel();
    if (s == 0) return flat_->all_gather(output, input);
    auto mid = std::make_shared<Tensor>(), local_major = std::make_shared<Tensor>();
    std::vector<Stage> stages;
    stages.push_back([=, this] {
      *mid = empty({nodes_ * s}, {.dtype = input.dtype(), .device = device()});
      return inter_->all_gather(*mid, input);
    });
    stages.push_back([=, this] {
      *local_major = empty({size() * s}, {.dtype = input.dtype(), .device = device()});
      return intra_->all_gather(*local_major, *mid);
    });
    stages.push_back([=, this]() -> WorkPtr {
      // (as the flat group's engine would: no version bump on the output, Note in ops/copy.h)
      Tensor dst = output.view({nodes_, k_, s});
      ops::copy_as_communication_(dst, local_major->view({k_, nodes_, s}).transpose(0, 1));
      *mid = Tensor();
      *local_major = Tensor();
      return nullptr;
    });
    return chain_work(std::move(stages), side_.get(), {output, input});
  }

  WorkPtr reduce(const Tensor& t, int root, ReduceOp op) override { return flat_->reduce(t, root, op); }
  WorkPtr broadcast(const Tensor& t, int root) override { return flat_->broadcast(t, root); }
  WorkPtr gather(const Tensor& o, const Tensor& i, int root) override { return flat_->gather(o, i, root); }
  WorkPtr scatter(const Tensor& o, const Tensor& i, int root) override { return flat_->scatter(o, i, root); }
  WorkPtr all_to_all(const Tensor& o, const Tensor& i) override { return flat_->all_to_all(o, i); }
  WorkPtr send(const Tensor& t, int dst, int tag) override { return flat_->send(t, dst, tag); }
  WorkPtr recv(const Tensor& t, int src, int tag) override { return flat_->recv(t, src, tag); }
  WorkPtr barrier() override { return flat_->barrier(); }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override { return flat_->new_group(ranks); }
  void watch_replayed_work(const char* what) override {
    flat_->watch_replayed_work(what);
    intra_->watch_replayed_work(what);
    inter_->watch_replayed_work(what);
  }

 NodeGroups parts() const { return {intra_, inter_, k_}; }

 private:
  ProcessGroupPtr flat_, intra_, inter_;
  int k_, nodes_, local_;
  std::unique_ptr<runtime::SideStream> side_;
};

}  // namespace

ProcessGroupPtr make_hierarchical(const ProcessGroupPtr& flat, int per_node, const LinkPace& inter_pace) {
  FORGE_CHECK(flat != nullptr, "make_hierarchical: no group");
  const int W = flat->size();
  FORGE_CHECK(per_node >= 1, "dist.node_size: ranks per node must be >= 1, got ", per_node);
  if (per_node == 1 || per_node >= W) return flat;
  FORGE_CHECK(W % per_node == 0, "dist.dp_reduce = \"hierarchical\": the data-parallel group's ", W,
              " ranks do not split into nodes of ", per_node,
              " (dist.node_size and the launch's ranks per node must give every node the same number of the "
              "group's ranks); use dist.dp_reduce = \"flat\" or a node size that divides ",
              W);
  const int nodes = W / per_node, node = flat->rank() / per_node, local = flat->rank() % per_node;
  ProcessGroupPtr intra, inter;
  for (int n = 0; n < nodes; ++n) {  // collective over `flat`: every rank, the same lists, the same order
    std::vector<int> ranks;
    for (int l = 0; l < per_node; ++l) ranks.push_back(n * per_node + l);
    ProcessGroupPtr g = flat->new_group(ranks);
    if (n == node) intra = std::move(g);
  }
  for (int l = 0; l < per_node; ++l) {
    std::vector<int> ranks;
    for (int n = 0; n < nodes; ++n) ranks.push_back(n * per_node + l);
    ProcessGroupPtr g = flat->new_group(ranks);
    if (l == local) inter = std::move(g);
  }
  FORGE_CHECK(intra && inter, "make_hierarchical: rank ", flat->rank(), " got no node group");
  inter = make_paced(inter, inter_pace);
  return std::make_shared<HierarchicalGroup>(flat, std::move(intra), std::move(inter), per_node);
}

std::optional<NodeGroups> node_groups(const ProcessGroupPtr& g) {
  if (const auto* h = dynamic_cast<const HierarchicalGroup*>(g.get())) return h->parts();
  return std::nullopt;
}

int group_ranks_per_node(const std::vector<int>& world_ranks, int node_size) {
  FORGE_CHECK(node_size >= 1, "dist.node_size: ranks per node must be >= 1, got ", node_size);
  FORGE_CHECK(!world_ranks.empty(), "group_ranks_per_node: an empty group");
  auto fail = [&](const std::string& why) {
    std::string list;
    for (int r : world_ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    FORGE_THROW("the data-parallel group of ranks [", list, "] on nodes of ", node_size,
                " ranks (dist.node_size, or the launcher's ranks per host) ", why,
                "; dist.dp_reduce = \"hierarchical\" and dist.link_gbps need every node to hold the same number of "
                "them: choose such a dist.node_size, or leave both off");
  };
  int per_node = 0, count = 0, node = world_ranks.front() / node_size;
  for (size_t i = 0; i < world_ranks.size(); ++i) {
    const int n = world_ranks[i] / node_size;
    if (n != node) {
      if (n < node) fail("is not numbered node by node");
      if (per_node != 0 && count != per_node) fail("puts different numbers of them on different nodes");
      per_node = count;
      count = 0;
      node = n;
    }
    ++count;
  }
  if (per_node != 0 && count != per_node) fail("puts different numbers of them on different nodes");
  return per_node == 0 ? count : per_node;
}

ProcessGroupPtr node_aware_group(const ProcessGroupPtr& flat, const std::vector<int>& world_ranks, const NodeLayout& nodes) {
  FORGE_CHECK(flat != nullptr && static_cast<int>(world_ranks.size()) == flat->size(),
              "node_aware_group: the member list does not match the group");
  const int per_node = group_ranks_per_node(world_ranks, nodes.node_size);
  if (per_node >= flat->size()) return flat;  // one node: nothing crosses a network
  LinkPace pace = nodes.link;
  if (nodes.hierarchical && per_node > 1) {
    pace.share = nodes.node_size;  // every rank of a node is in one inter-node group, all crossing at once
    return make_hierarchical(flat, per_node, pace);
  }
  return paced_across_nodes(flat, world_ranks, nodes.node_size, nodes.link);
}

ProcessGroupPtr paced_across_nodes(const ProcessGroupPtr& g, const std::vector<int>& world_ranks, int node_size,
                                   const LinkPace& link) {
  FORGE_CHECK(g != nullptr && static_cast<int>(world_ranks.size()) == g->size(),
              "paced_across_nodes: the member list does not match the group");
  if (link.gbps <= 0) return g;
  const int per_node = group_ranks_per_node(world_ranks, node_size);
  if (per_node >= g->size()) return g;
  LinkPace pace = link;
  pace.share = std::max(node_size / per_node, 1);  // the node's copies of this group, crossing at once
  return make_paced(g, pace);
}

}  // namespace forge::parallel
