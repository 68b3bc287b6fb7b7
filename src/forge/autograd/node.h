#pragma once
// The autograd graph: Nodes (one per recorded op) joined by Edges to the nodes that
// produced their inputs. Every node has exactly one output (multi-output ops such as
// split are recorded as one view node per output).
//
// A node's apply() takes d(loss)/d(output) and returns d(loss)/d(input_i) for each
// input, in the order of next_edges (an undefined Tensor where an input needs none).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::autograd {

class Node;

// Note [column sums handed to the producer]: a linear's bias gradient is the column sums of the
// gradient of its output. When the op consuming that output (GPT's add_layer_norm, whose
// backward writes the residual stream's gradient, which is the projection's output gradient)
// computes those sums in a kernel it runs anyway, it leaves them here, on the producing node,
// with the gradient tensor they belong to; the producer uses them only when the gradient it
// receives is that very tensor, its storage at the same version (nothing written into it in
// place since), else computes its own.
// How many times a slot's sums were used, process-wide (for tests: that the hand-over happens).
int64_t column_sums_handed_over();
void count_column_sums_handed_over();
struct ColumnSumsSlot {
  std::weak_ptr<TensorImpl> of;  // the gradient tensor the sums are of (weak: no extra owner)
  uint64_t version = 0;          // its storage's version then
  Tensor sums;                   // (C), the gradient's dtype
  void leave(const Tensor& grad, Tensor column_sums) {
    of = grad.impl_ptr();
    version = grad.storage()->version();
    sums = std::move(column_sums);
  }
  // The sums if they are of `g` itself (and clears the slot), else undefined.
  Tensor take_for(const Tensor& g) {
    Tensor s;
    if (sums.defined() && of.lock() == g.impl_ptr() && g.storage()->version() == version) {
      s = sums;
      count_column_sums_handed_over();
    }
    sums = Tensor();
    of.reset();
    return s;
  }
};

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
};

// What a gradient for an input must look like; checked by the engine.
struct InputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual TensorList apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;
  // Frees what the node saved for backward; apply() afterwards is an error.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<InputMeta> input_meta;
  // Note [pending input gradient]: >= 0 asks the engine to hand this node, while it runs, the
  // gradient its input `fuse_input_grad` has already accumulated from the input's other
  // consumers (take_pending_input_grad()), so the node can add it into its own gradient for
  // that input inside a kernel it runs anyway (the norm backward adds the residual stream's
  // gradient: one pass over memory less than the engine's separate addition). A node that
  // takes it returns the sum; one that does not leaves it to the engine, as usual.
  int fuse_input_grad = -1;
  // Creation order: the engine prefers later nodes when several are ready, like PyTorch.
  uint64_t sequence_nr;
  // The transformer block whose forward recorded this node (-1: none; core/trace_range.h): the
  // engine's "backward: block i" trace ranges.
  int64_t block = -1;
  // What this node's backward allocates is labelled so (Note [memory owners]): "backward: <op>",
  // interned when the node is recorded; null for nodes of no op (the engine labels them by name).
  const char* memory_label = nullptr;
  // Note [column sums handed to the producer]: set by a node that can use the column sums of its
  // output's gradient (a CUDA linear with a bias); null otherwise.
  std::shared_ptr<ColumnSumsSlot> output_column_sums;
};

// The mask handed to backward functions: need[i] is false when input i needs no gradient,
// so the function may skip computing it (and return an undefined Tensor).
using GradMask = std::vector<bool>;
using BackwardFn = std::function<TensorList(const Tensor& grad, const GradMask& need)>;

// A node whose backward is a closure over the tensors it saved. The closure is destroyed
// right after the node runs (unless retain_graph), which releases the saved tensors.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  TensorList apply(const Tensor& grad_output) override;
  std::string name() const override { return name_; }
  void release_saved() override {
    fn_ = nullptr;
    saved_.clear();
  }
  // Remembers the storage version of a tensor the closure saved; apply() refuses to run
  // if it was modified in place since (the gradient would silently be wrong).
  void watch_saved(const Tensor& t);

 private:
  struct SavedVersion {
    std::weak_ptr<Storage> storage;
    uint64_t version;
    Shape shape;
  };
  std::string name_;
  BackwardFn fn_;
  std::vector<SavedVersion> saved_;
};

// The sink for a leaf: adds the incoming gradient into leaf.grad, then runs its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  TensorList apply(const Tensor& grad_output) override;
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// Inside a node's backward function (Note [pending input gradient]): the gradient accumulated so
// far for the node's input Node::fuse_input_grad, handed over to the caller (who must then
// include it in the gradient it returns for that input); undefined when there is none yet or
// the node did not ask for it. A second call returns undefined.
Tensor take_pending_input_grad();

// a and b are the same view of the same memory (a gradient that arrives as a leaf's claimed
// gradient buffer, Note [claimed grad buffer]).
inline bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage() && a.offset() == b.offset() &&
         a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

// The node a gradient for `t` flows into: its grad_fn, or its leaf accumulator.
// Returns null if t does not require grad.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

// Records `out` as produced by an op named `name` from `inputs` if grad mode is on and any
// input requires grad; `fn` computes the inputs' gradients from out's. Returns `out`.
//
//   auto y = ...;  // computed without history
//   return record("exp", y, {x}, [y = y.detach()](const Tensor& g, const GradMask&) {
//     return TensorList{g * y};
//   });
//
// Saved outputs must be captured detached (as above): capturing `out` itself would make a
// reference cycle out -> node -> out. List every tensor the closure captures in `saved`:
// backward then fails with a clear error if one of them was modified in place after the
// forward (Note [saved tensor versions]).
Tensor& record(const char* name, Tensor& out, const TensorList& inputs, BackwardFn fn, const TensorList& saved = {});

// True if grad mode is on and any of `inputs` requires grad.
bool any_requires_grad(const TensorList& inputs);

}  // namespace forge::autograd
