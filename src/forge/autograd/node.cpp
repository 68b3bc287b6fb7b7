#include "forge/autograd/node.h"

#include <string>
#include <unordered_map>

#include "forge/autograd/grad_mode.h"
#include "forge/core/memory_owner.h"
#include "forge/core/trace_range.h"

namespace forge::autograd {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

namespace {
std::atomic<int64_t> g_column_sums_handed_over{0};
}  // namespace
int64_t column_sums_handed_over() { return g_column_sums_handed_over.load(); }
void count_column_sums_handed_over() { g_column_sums_handed_over.fetch_add(1); }

TensorList FunctionNode::apply(const Tensor& grad_output) {
  FORGE_CHECK(fn_ != nullptr, "backward: tried to run ", name_,
              " a second time, but its saved tensors were freed after the first backward. "
              "Pass retain_graph=true to the first backward() if you need to backward through the graph again.");
  // Note [saved tensor versions]: every in-place op bumps its storage's version; a saved
  // tensor whose version moved was overwritten after the forward used it.
  for (const SavedVersion& sv : saved_) {
    auto st = sv.storage.lock();
    FORGE_CHECK(!st || st->version() == sv.version, "backward: a tensor of shape ", sv.shape, " saved by ", name_,
                " was modified by an in-place operation after the forward used it (storage version ", st->version(),
                ", expected ", sv.version, "); use an out-of-place op, or clone() the tensor before modifying it");
  }
  GradMask need(next_edges.size());
  for (size_t i = 0; i < next_edges.size(); ++i) need[i] = next_edges[i].node != nullptr;
  return fn_(grad_output, need);
}

TensorList AccumulateGrad::apply(const Tensor& g) {
  AutogradMeta& m = leaf_->meta();
  if (!m.grad.defined()) {
    // Take the incoming buffer when nothing else can see it; otherwise copy, so that
    // later in-place accumulation never writes into another tensor's memory.
    const bool owned = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                       g.offset() == 0;
    m.grad = owned ? g : g.clone();
  } else if (m.overwrite_grad) {
    // A pre-allocated buffer (Tensor::set_grad_buffer): overwritten, so never zero-filled.
    // Note [claimed grad buffer]: a backward function that claimed the buffer
    // (Tensor::claim_grad_buffer) wrote the gradient into it; when that is what arrives,
    // there is nothing to copy. Anything else (the claimed gradient summed with another
    // use's, say) is a new tensor and is copied in.
    if (!same_view(g, m.grad)) m.grad.copy_(g);
    m.overwrite_grad = false;
    m.grad_buffer_claimed = false;
  } else {
    m.grad.add_(g);
  }
  if (!m.grad_hooks.empty()) {
    Tensor leaf(leaf_);
    for (auto& hook : m.grad_hooks) hook(leaf);
  }
  return {};
}

void FunctionNode::watch_saved(const Tensor& t) {
  if (t.defined()) saved_.push_back({t.storage(), t.storage()->version(), t.shape()});
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.requires_grad()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  AutogradMeta& m = t.impl()->meta();
  auto acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m.grad_accumulator = acc;
  }
  return acc;
}

bool any_requires_grad(const TensorList& inputs) {
  if (!grad_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor& record(const char* name, Tensor& out, const TensorList& inputs, BackwardFn fn, const TensorList& saved) {
  if (!any_requires_grad(inputs)) return out;
  FORGE_CHECK(is_floating(out.dtype()), name, ": internal error: recording history for a ", dtype_name(out.dtype()),
              " output");
  FORGE_CHECK(!out.grad_fn(), name, ": internal error: output already has history");
  auto node = std::make_shared<FunctionNode>(std::string(name) + "Backward", std::move(fn));
  node->block = trace::current_block();
  {  // (keyed by the op's name literal: one lookup of a pointer per recorded node)
    thread_local std::unordered_map<const char*, const char*> labels;
    auto [it, fresh] = labels.try_emplace(name, nullptr);
    if (fresh) it->second = intern_memory_owner(std::string("backward: ") + name + "Backward");
    node->memory_label = it->second;
  }
  for (const auto& t : saved) node->watch_saved(t);
  node->next_edges.reserve(inputs.size());
  node->input_meta.reserve(inputs.size());
  for (const auto& t : inputs) {
    if (t.defined()) {
      node->next_edges.push_back({gradient_edge(t)});
      node->input_meta.push_back({t.shape(), t.dtype(), t.device()});
    } else {
      node->next_edges.push_back({nullptr});
      node->input_meta.push_back({{}, DType::f32, Device::cpu()});
    }
  }
  AutogradMeta& m = out.impl()->meta();
  m.requires_grad = true;
  m.grad_fn = std::move(node);
  return out;
}

}  // namespace forge::autograd
