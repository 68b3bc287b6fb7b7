#pragma once
// Tensor: a cheap, shared handle to (storage, shape, strides, offset, dtype) plus the
// autograd state (requires_grad, grad, grad_fn).
//
// Copying a Tensor copies the handle, not the data: `Tensor b = a;` aliases. Views
// (reshape, transpose, narrow, expand, ...) make a new TensorImpl over the same Storage.
// The metadata accessors are defined in core/; methods that are ops (reshape, to, +, ...)
// are declared here for convenience and defined in ops/ (src/forge/ops/tensor_methods.cpp),
// and backward() in autograd/. Core itself includes neither.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "forge/core/device.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/shape.h"
#include "forge/core/storage.h"

namespace forge {

namespace autograd {
class Node;
}

class Tensor;
using TensorList = std::vector<Tensor>;

// Called with the leaf once its .grad holds this backward's final value.
using GradHook = std::function<void(Tensor& leaf)>;

struct AutogradMeta;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;  // created on first use

  TensorImpl() = default;
  ~TensorImpl();
  AutogradMeta& meta();
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A tensor over existing storage (a view). Strides/offset in elements.
  static Tensor make(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset,
                     DType dtype);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata -------------------------------------------------------------
  const Shape& shape() const { return checked().shape; }
  const Strides& strides() const { return checked().strides; }
  int64_t dim() const { return static_cast<int64_t>(checked().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const { return checked().offset; }
  int64_t numel() const { return shape_numel(checked().shape); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  // A CPU tensor in page-locked memory (pin_memory()): copies to and from the GPU can be
  // asynchronous (to(device, /*non_blocking=*/true)).
  bool is_pinned() const { return storage()->allocator()->is_pinned(); }
  size_t element_size() const { return forge::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }

  // Pointer to the first element (storage base + offset).
  void* data_ptr() const;
  template <class T> T* data() const {
    FORGE_CHECK(dtype() == dtype_v<T>, "Tensor::data<", dtype_name(dtype_v<T>), ">: tensor has dtype ",
                dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }
  // The single element of a one-element tensor, converted to T (copied to the host if needed).
  template <class T = double> T item() const {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(item_int64());  // exact for large integers
    else return static_cast<T>(item_double());
  }
  double item_double() const;
  int64_t item_int64() const;
  // All elements in row-major order, converted to T (copied to the host if needed).
  template <class T> std::vector<T> to_vector() const;

  // ---- autograd -------------------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  const Tensor& grad() const;
  void set_grad(const Tensor& g) const;
  // Makes `buffer` this leaf's .grad to be OVERWRITTEN by the next backward's first
  // accumulation instead of added to (later ones add): a pre-allocated gradient buffer, such
  // as DDP's bucket views, that need not be zero-filled first. grad_buffer_pending() is true
  // until that first accumulation (the buffer then holds stale values).
  void set_grad_buffer(const Tensor& buffer) const;
  bool grad_buffer_pending() const;
  // For a backward function that produces this leaf's gradient: the pending buffer itself
  // (once per backward; undefined if there is none, it was already claimed, or its shape,
  // dtype or layout differ), for the function to write the gradient straight into. A
  // gradient that arrives as that buffer is then taken without a copy (Note [claimed grad
  // buffer], autograd/node.cpp).
  Tensor claim_grad_buffer(const Shape& shape, DType dtype) const;
  void zero_grad() const;  // drops .grad (like PyTorch's set_to_none=True)
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // Hooks run after a leaf's .grad has been accumulated for this backward call
  // (PyTorch's register_post_accumulate_grad_hook). DDP bucketing hangs here.
  void register_grad_hook(GradHook hook) const;
  // Same data, no history: the result is a leaf that does not require grad.
  Tensor detach() const;
  // Re-points this handle (and every copy of it) at `src`'s storage, shape, strides and
  // dtype, keeping requires_grad and dropping .grad. Module::to() and load_state_dict()
  // use it so that parameters held by modules stay the same objects. Leaves only.
  void set_data(const Tensor& src) const;
  // Reverse-mode backward from this tensor (defined in autograd/engine.cpp). `grad` may be
  // omitted for a one-element tensor (it defaults to 1).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  // ---- ops as methods (defined in ops/tensor_methods.cpp) --------------------
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  // With non_blocking, a copy between a pinned CPU tensor and a GPU is only queued on the
  // GPU's current stream (a GPU -> CPU copy then returns a pinned tensor); synchronise
  // (cuda::synchronize, a stream or an event) before reading a CPU result. Otherwise as to(device).
  Tensor to(Device device, bool non_blocking) const;
  // A copy of this CPU tensor in pinned host memory (this tensor itself if already pinned).
  // Needs a CUDA device.
  Tensor pin_memory() const;
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor pow(double exponent) const;
  // In-place (not differentiable: they refuse tensors that require grad while grad mode is on).
  Tensor& fill_(double value);
  Tensor& zero_();
  Tensor& copy_(const Tensor& src);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double value);

  std::string to_string() const;  // PyTorch-style printing (ops/print.cpp)

 private:
  const TensorImpl& checked() const {
    FORGE_CHECK(impl_ != nullptr, "use of an undefined (default-constructed) Tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only; owned by the graph
  std::vector<GradHook> grad_hooks;
  bool overwrite_grad = false;  // set_grad_buffer: the next accumulation replaces grad's values
  bool grad_buffer_claimed = false;  // claim_grad_buffer handed the pending buffer out
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Arithmetic operators (ops/tensor_methods.cpp): elementwise with broadcasting.
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

}  // namespace forge
