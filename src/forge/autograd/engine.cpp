#include "forge/autograd/engine.h"

#include <string>
#include <unordered_map>

#include "forge/core/memory_owner.h"
#include "forge/core/trace_range.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"

namespace forge::autograd {
namespace {

struct LaterFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr < b->sequence_nr;
  }
};

// True when `buf` is the gradient buffer that `next`'s leaf handed to a backward function
// (Note [claimed grad buffer], node.cpp): the gradient was written there, not into memory of
// its own.
bool is_claimed_buffer(const Tensor& buf, const Node& next) {
  const auto* acc = dynamic_cast<const AccumulateGrad*>(&next);
  if (acc == nullptr || acc->leaf()->autograd == nullptr) return false;
  const AutogradMeta& m = *acc->leaf()->autograd;
  return m.overwrite_grad && m.grad_buffer_claimed && same_view(buf, m.grad);
}

// Sums a further gradient into `next`'s input. Into the claimed gradient buffer itself when
// that is what the input is (a weight used twice, as GPT's tied embedding and head): the sum
// then lands where AccumulateGrad would have copied it.
void accumulate(Tensor& buf, Tensor g, const Node& next) {
  if (!buf.defined()) {
    buf = std::move(g);
  } else if (g.shape() == buf.shape() && g.dtype() == buf.dtype() && g.device() == buf.device() &&
             is_claimed_buffer(buf, next)) {
    buf.add_(g);
  } else {
    buf = buf + g;
  }
}

void check_grad(const Node& node, size_t i, const Tensor& g) {
  const InputMeta& m = node.input_meta[i];
  FORGE_CHECK(g.shape() == m.shape && g.dtype() == m.dtype && g.device() == m.device, "backward: ", node.name(),
              " returned a gradient of shape ", g.shape(), " ", dtype_name(g.dtype()), " on ", g.device().str(),
              " for input ", i, ", which has shape ", m.shape, " ", dtype_name(m.dtype), " on ", m.device.str());
}

}  // namespace

namespace {
thread_local bool t_retaining_graph = false;
thread_local Tensor t_pending_input_grad;  // Note [pending input gradient]
}  // namespace

Tensor take_pending_input_grad() { return std::move(t_pending_input_grad); }

bool retaining_graph() { return t_retaining_graph; }

void backward(const TensorList& roots, const TensorList& grads, bool retain_graph) {
  struct RetainScope {
    bool prev;
    explicit RetainScope(bool on) : prev(t_retaining_graph) { t_retaining_graph = on; }
    ~RetainScope() { t_retaining_graph = prev; }
  } retain_scope(retain_graph);
  FORGE_CHECK(grads.empty() || grads.size() == roots.size(), "backward: got ", grads.size(), " gradients for ",
              roots.size(), " roots");
  std::unordered_map<Node*, Tensor> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < roots.size(); ++i) {
      const Tensor& r = roots[i];
      FORGE_CHECK(r.requires_grad(), "backward: the tensor of shape ", r.shape(),
                  " does not require grad and has no grad_fn (did you forget requires_grad_() on an input, "
                  "or compute it under NoGradGuard?)");
      Tensor g = grads.empty() ? Tensor() : grads[i];
      if (!g.defined()) {
        FORGE_CHECK(r.numel() == 1, "backward: a gradient can be created implicitly only for one-element outputs; "
                                    "the output has shape ", r.shape(), ", so pass backward(grad) explicitly");
        g = r.detach().clone().fill_(1.0);
      } else {
        FORGE_CHECK(g.shape() == r.shape() && g.dtype() == r.dtype() && g.device() == r.device(),
                    "backward: grad of shape ", g.shape(), " ", dtype_name(g.dtype()), " does not match the output's ",
                    r.shape(), " ", dtype_name(r.dtype()));
      }
      auto node = gradient_edge(r);
      Tensor& buf = buffers[node.get()];
      buf = buf.defined() ? buf + g : g;
      root_nodes.push_back(std::move(node));
    }
  }

  // Dependency counts: how many edges point at each node from the part of the graph
  // reachable from the roots. Iterative DFS.
  std::unordered_map<Node*, int> deps;
  {
    std::unordered_set<Node*> seen;
    std::vector<Node*> stack;
    for (auto& n : root_nodes)
      if (seen.insert(n.get()).second) stack.push_back(n.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.node) continue;
        ++deps[e.node.get()];
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
    }
  }

  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, LaterFirst> ready;
  {
    std::unordered_set<Node*> queued;
    for (auto& n : root_nodes)
      if (deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push(n);
  }

  NoGradGuard no_grad;
  // Trace ranges "backward: block i" (core/trace_range.h): opened when the next node belongs to
  // another block than the one open, closed at the end (only while a sink is installed). Nodes of
  // no block (parameters' gradient accumulation, the head's, the embedding's) leave the open
  // range as it is: they run between a block's nodes and would cut its range into pieces.
  struct BlockRanges {
    trace::RangeSink* sink = trace::sink();
    int64_t open = -1;
    void at(int64_t block) {
      if (!sink || block < 0 || block == open) return;
      if (open >= 0) sink->end_range();
      if (block >= 0) sink->begin_range(trace::backward_block_name(block));
      open = block;
    }
    ~BlockRanges() {
      if (sink && open >= 0) sink->end_range();
    }
  } block_ranges;
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    block_ranges.at(node->block);
    Tensor g;
    if (auto it = buffers.find(node.get()); it != buffers.end()) {
      g = std::move(it->second);
      buffers.erase(it);
    }
    TensorList out;
    if (g.defined()) {
      // Note [pending input gradient]: hand over what the fused input has accumulated so far.
      Node* fused = nullptr;
      if (node->fuse_input_grad >= 0 && static_cast<size_t>(node->fuse_input_grad) < node->next_edges.size())
        fused = node->next_edges[static_cast<size_t>(node->fuse_input_grad)].node.get();
      if (fused) {
        if (auto it = buffers.find(fused); it != buffers.end() && it->second.defined()) {
          t_pending_input_grad = std::move(it->second);
          buffers.erase(it);
        }
      }
      {
        // Never left behind for another node, also when apply() throws.
        struct ClearPending {
          ~ClearPending() { t_pending_input_grad = Tensor(); }
        } clear_pending;
        // Note [memory owners]: what this node allocates is "backward: <its op>" (labelled when
        // recorded; other nodes by their name, looked up once per name).
        const char* label = node->memory_label;
        if (label == nullptr) {
          thread_local std::unordered_map<std::string, const char*> labels;
          const std::string op = node->name();
          auto it = labels.find(op);
          if (it == labels.end()) it = labels.emplace(op, intern_memory_owner("backward: " + op)).first;
          label = it->second;
        }
        const MemoryOwner owner(label);
        out = node->apply(g);
        if (t_pending_input_grad.defined()) buffers[fused] = std::move(t_pending_input_grad);  // not taken: added as usual
      }
      g = Tensor();
      if (!retain_graph) node->release_saved();
      FORGE_CHECK(out.empty() || out.size() == node->next_edges.size(), "backward: ", node->name(), " returned ",
                  out.size(), " gradients for ", node->next_edges.size(), " inputs");
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const auto& next = node->next_edges[i].node;
      if (!next) continue;
      if (i < out.size() && out[i].defined()) {
        check_grad(*node, i, out[i]);
        accumulate(buffers[next.get()], std::move(out[i]), *next);
      }
      if (--deps[next.get()] == 0) ready.push(next);
    }
  }
}

}  // namespace forge::autograd

namespace forge {
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}
}  // namespace forge
