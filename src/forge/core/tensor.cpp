#include "forge/core/tensor.h"

#include <string>

#include "forge/core/env.h"

namespace forge {

TensorImpl::~TensorImpl() = default;

AutogradMeta& TensorImpl::meta() {
  if (!autograd) autograd = std::make_unique<AutogradMeta>();
  return *autograd;
}

Tensor Tensor::make(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype) {
  FORGE_CHECK(shape.size() == strides.size(), "Tensor::make: shape ", shape, " and strides ", strides,
              " have different lengths");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "Tensor::size")]; }

int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "Tensor::stride")]; }

bool Tensor::is_contiguous() const {
  const auto& sh = shape();
  const auto& st = strides();
  if (shape_numel(sh) == 0) return true;
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& im = checked();
  FORGE_CHECK(!im.storage->is_released(), "a tensor of shape ", im.shape, " is read while its memory is released (a ",
              "ZeRO-3 parameter outside its block's forward and backward; Note [released storage])");
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<int64_t>(element_size());
}

bool Tensor::requires_grad() const {
  const auto& im = checked();
  return im.autograd && im.autograd->requires_grad;
}

Tensor& Tensor::requires_grad_(bool on) {
  FORGE_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating-point tensors can require gradients, got ",
              dtype_name(dtype()), " tensor of shape ", shape());
  FORGE_CHECK(on || is_leaf(), "requires_grad_(false): this tensor is not a leaf (it was computed by ",
              "an op that records history); use detach() to get a tensor without history");
  impl_->meta().requires_grad = on;
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const auto& im = checked();
  return im.autograd ? im.autograd->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    FORGE_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(),
                "set_grad: gradient of shape ", g.shape(), " ", dtype_name(g.dtype()), " on ", g.device().str(),
                " does not match the tensor's shape ", shape(), " ", dtype_name(dtype()), " on ", device().str());
  }
  impl_->meta().grad = g;
  impl_->meta().overwrite_grad = false;
  impl_->meta().grad_buffer_claimed = false;
}

void Tensor::set_grad_buffer(const Tensor& buffer) const {
  FORGE_CHECK(buffer.defined(), "set_grad_buffer: the buffer is undefined");
  set_grad(buffer);
  impl_->meta().overwrite_grad = true;
}

bool Tensor::grad_buffer_pending() const { return impl_->autograd != nullptr && impl_->autograd->overwrite_grad; }

Tensor Tensor::claim_grad_buffer(const Shape& shape, DType dtype) const {
  // FORGE_NO_GRAD_BUFFER_CLAIM=1 (a diagnostic, core/env.h, docs/dist.md): never hand the buffer
  // out, so gradients are computed into memory of their own and copied in (what this saves).
  if (env::flag("FORGE_NO_GRAD_BUFFER_CLAIM") || !defined() || impl_->autograd == nullptr || impl_->autograd->grad_fn) return Tensor();
  AutogradMeta& m = *impl_->autograd;
  if (!m.overwrite_grad || m.grad_buffer_claimed || !m.grad.defined() || m.grad.shape() != shape ||
      m.grad.dtype() != dtype || !m.grad.is_contiguous())
    return Tensor();
  m.grad_buffer_claimed = true;
  return m.grad;
}

void Tensor::zero_grad() const {
  if (checked().autograd) impl_->autograd->grad = Tensor();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const auto& im = checked();
  return im.autograd ? im.autograd->grad_fn : kNone;
}

void Tensor::register_grad_hook(GradHook hook) const {
  FORGE_CHECK(requires_grad() && is_leaf(), "register_grad_hook: the tensor must be a leaf that requires grad ",
              "(shape ", shape(), ")");
  impl_->meta().grad_hooks.push_back(std::move(hook));
}

void Tensor::set_data(const Tensor& src) const {
  FORGE_CHECK(is_leaf(), "set_data: only leaves can be re-pointed (shape ", shape(), ")");
  FORGE_CHECK(!src.requires_grad() || src.is_leaf(), "set_data: the source must not carry history");
  FORGE_CHECK(!requires_grad() || is_floating(src.dtype()), "set_data: a tensor that requires grad needs a floating ",
              "dtype, got ", dtype_name(src.dtype()));
  const TensorImpl& s = *src.impl_;
  impl_->storage = s.storage;
  impl_->shape = s.shape;
  impl_->strides = s.strides;
  impl_->offset = s.offset;
  impl_->dtype = s.dtype;
  if (impl_->autograd) {
    impl_->autograd->grad = Tensor();
    impl_->autograd->grad_accumulator.reset();
  }
}

Tensor Tensor::detach() const {
  const auto& im = checked();
  return make(im.storage, im.shape, im.strides, im.offset, im.dtype);
}

}  // namespace forge
