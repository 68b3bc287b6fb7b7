// Tensor's op methods and operators: thin forwards to forge::ops.
#include <cstring>

#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"

namespace forge {

Tensor Tensor::reshape(const Shape& s) const { return ops::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return ops::view(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return ops::flatten(*this, a, b); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return ops::transpose(*this, a, b); }
Tensor Tensor::t() const {
  FORGE_CHECK(dim() <= 2, "t(): expects a tensor with <= 2 dims, got shape ", shape(), "; use transpose(d0, d1)");
  return dim() < 2 ? *this : ops::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return ops::permute(*this, d); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return ops::narrow(*this, d, s, l); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return ops::slice(*this, d, s, e, st); }
Tensor Tensor::select(int64_t d, int64_t i) const { return ops::select(*this, d, i); }
Tensor Tensor::expand(const Shape& s) const { return ops::expand(*this, s); }
Tensor Tensor::squeeze(int64_t d) const { return ops::squeeze(*this, d); }
Tensor Tensor::squeeze() const { return ops::squeeze(*this); }
Tensor Tensor::unsqueeze(int64_t d) const { return ops::unsqueeze(*this, d); }
Tensor Tensor::contiguous() const { return ops::contiguous(*this); }
Tensor Tensor::clone() const { return ops::clone(*this); }
Tensor Tensor::to(DType d) const { return ops::to(*this, d); }
Tensor Tensor::to(Device d) const { return ops::to(*this, d); }
Tensor Tensor::to(Device d, DType t) const { return ops::to(*this, d, t); }
Tensor Tensor::to(Device d, bool non_blocking) const { return ops::to(*this, d, dtype(), non_blocking); }
Tensor Tensor::pin_memory() const { return ops::pin_memory(*this); }
Tensor Tensor::sum() const { return ops::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& d, bool k) const { return ops::sum(*this, d, k); }
Tensor Tensor::mean() const { return ops::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& d, bool k) const { return ops::mean(*this, d, k); }
Tensor Tensor::matmul(const Tensor& o) const { return ops::matmul(*this, o); }
Tensor Tensor::exp() const { return ops::exp(*this); }
Tensor Tensor::log() const { return ops::log(*this); }
Tensor Tensor::pow(double e) const { return ops::pow(*this, e); }

Tensor& Tensor::fill_(double v) { return ops::fill_(*this, v); }
Tensor& Tensor::zero_() { return ops::fill_(*this, 0.0); }
Tensor& Tensor::copy_(const Tensor& src) { return ops::copy_(*this, src); }
Tensor& Tensor::add_(const Tensor& o, double alpha) { return ops::add_(*this, o, alpha); }
Tensor& Tensor::mul_(double v) { return ops::mul_(*this, v); }

double Tensor::item_double() const {
  FORGE_CHECK(numel() == 1, "item(): expects a one-element tensor, got shape ", shape());
  Tensor h = ops::to(*this, Device::cpu(), DType::f64);
  return *static_cast<const double*>(h.data_ptr());
}

int64_t Tensor::item_int64() const {
  FORGE_CHECK(numel() == 1, "item(): expects a one-element tensor, got shape ", shape());
  Tensor h = ops::to(detach(), Device::cpu(), DType::i64);
  return *static_cast<const int64_t*>(h.data_ptr());
}

template <class T> std::vector<T> Tensor::to_vector() const {
  Tensor h = ops::contiguous(ops::to(detach(), Device::cpu(), dtype_v<T>));
  std::vector<T> v(static_cast<size_t>(numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(T));
  return v;
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<uint8_t> Tensor::to_vector() const;
template std::vector<bf16> Tensor::to_vector() const;
template std::vector<f16> Tensor::to_vector() const;

Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator+(const Tensor& a, double b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, double b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return ops::div(a, b); }
Tensor operator+(double a, const Tensor& b) { return ops::add(b, a); }
Tensor operator-(double a, const Tensor& b) { return ops::rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return ops::mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return ops::rdiv(b, a); }

}  // namespace forge
