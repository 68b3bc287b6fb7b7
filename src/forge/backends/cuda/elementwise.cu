// CUDA elementwise kernels of the unary and binary families: the counterparts of
// backends/cpu/unary.cpp and backends/cpu/binary.cpp, computing with the same shared
// functors (backends/unary_functors.h, backends/binary_functors.h).
//
// Math (A = acc_t<T>: float for bf16/f16, else T itself; values rounded to T once, at the end):
//   unary           out[i] = T(op(A(x[i])))
//   unary_backward  out[i] = T(op'(A(g[i]), A(x[i]), A(y[i])))    = g * d op(x)/dx
//   binary          out[i] = T(op(A(a[i]), A(b[i])))               (add/sub: a +- alpha b)
//                   out[i] = op(A(a[i]), A(b[i]))                  (comparisons: bool out)
//   where           out[i] = cond[i] ? a[i] : b[i]
// Memory contract: out is overwritten, inputs only read (x, y, g, a, b, cond); inputs
// may be any strided views, including stride-0 broadcasts (the ops layer expands them to
// out's shape); out may be one of the inputs element-for-element (in-place add_/mul_).
// The engine is loops.cuh: one vectorised pass when everything is contiguous and
// aligned, else a strided pass.
//
// Instantiations: unary 14 ops x 4 float dtypes + {neg, abs, relu} x {i32, i64, u8};
// unary_backward 14 x 4; binary 7 arithmetic ops x 7 numeric dtypes + 6 comparisons x 8
// dtypes; where 8: about 230 kernels.
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/swiglu_functors.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

template <UnaryOp Op, class T> struct UnaryFn {
  __device__ T operator()(T x) const { return T(fn::Unary<Op>{}(static_cast<acc_t<T>>(x))); }
};

template <UnaryOp Op, class T> struct UnaryGradFn {
  __device__ T operator()(T g, T x, T y) const {
    using A = acc_t<T>;
    return T(fn::UnaryGrad<Op>{}(static_cast<A>(g), static_cast<A>(x), static_cast<A>(y)));
  }
};

template <BinaryOp Op>
inline constexpr bool kIsComparison = Op == BinaryOp::eq || Op == BinaryOp::ne || Op == BinaryOp::lt ||
                                      Op == BinaryOp::le || Op == BinaryOp::gt || Op == BinaryOp::ge;

template <BinaryOp Op, class T> struct BinaryFn {
  fn::Binary<Op> f;  // carries alpha for add/sub
  __device__ auto operator()(T a, T b) const {
    using A = acc_t<T>;
    if constexpr (kIsComparison<Op>) return static_cast<bool>(f(static_cast<A>(a), static_cast<A>(b)));
    else return T(f(static_cast<A>(a), static_cast<A>(b)));
  }
};

template <class T> struct SwiGluFn {
  __device__ T operator()(T a, T b) const { return T(fn::SwiGlu{}(static_cast<acc_t<T>>(a), static_cast<acc_t<T>>(b))); }
};
template <class T> struct SwiGluGradGateFn {
  __device__ T operator()(T g, T a, T b) const {
    using A = acc_t<T>;
    return T(fn::SwiGluGradGate{}(static_cast<A>(g), static_cast<A>(a), static_cast<A>(b)));
  }
};
template <class T> struct SwiGluGradUpFn {
  __device__ T operator()(T g, T a) const {
    return T(fn::SwiGluGradUp{}(static_cast<acc_t<T>>(g), static_cast<acc_t<T>>(a)));
  }
};

// Note [fast SwiGLU for 16-bit data] (FORGE_SWIGLU_FAST=1): the shared functors compute the
// sigmoid with expf and IEEE divisions, ~40 instructions an element for the backward's two
// gradients. An H200 profile (ncu, docs/performance.md item 28) had the LLaMA 0.85B backward at
// 134 us with the SM 68% busy and DRAM 69% (3.3 TB/s), the forward at 73 us, SM 70%. For bf16/f16
// these compute the same expressions with __expf and one correctly rounded reciprocal
// (s = 1 / (1 + e^-a), silu = a s): ~12 instructions, within a few f32 ulps of the functors, far
// below the 16-bit rounding of the result. f32/f64 keep the functors (and their bits).
template <class T> struct FastSwiGluFn {
  __device__ T operator()(T a, T b) const {
    const float x = static_cast<float>(a);
    return T(x * __frcp_rn(1.0f + __expf(-x)) * static_cast<float>(b));
  }
};

template <class T> __device__ __forceinline__ void fast_swiglu_grads(T g, T a, T b, T& da, T& db) {
  const float gf = static_cast<float>(g), x = static_cast<float>(a), u = static_cast<float>(b);
  const float s = __frcp_rn(1.0f + __expf(-x));
  const float silu = x * s;
  db = T(gf * silu);
  da = T(gf * u * s * (1.0f + x * (1.0f - s)));
}

// Note [one-pass SwiGLU backward]: dgate reads g, gate and up, dup reads g and gate; as two
// elementwise launches g and gate are read twice (5 f-wide reads, 2 writes). One pass reads each
// input once (3 reads, 2 writes): at LLaMA 0.85B's (8192, 5632) bf16, 461 MB a call instead of
// 646 MB. The same shared functors as the CPU, so the same bits as the two launches.
template <class T, bool kFastMath>
__global__ void __launch_bounds__(kBlockSize)
    swiglu_backward_kernel(const T* __restrict__ g, const T* __restrict__ a, const T* __restrict__ b,
                           T* __restrict__ da, T* __restrict__ db, int64_t n) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto one = [&](const T& gi, const T& ai, const T& bi, T& dai, T& dbi) {
    if constexpr (kFastMath) {
      fast_swiglu_grads(gi, ai, bi, dai, dbi);
    } else {
      dai = T(fn::SwiGluGradGate{}(static_cast<A>(gi), static_cast<A>(ai), static_cast<A>(bi)));
      dbi = T(fn::SwiGluGradUp{}(static_cast<A>(gi), static_cast<A>(ai)));
    }
  };
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += step) {
    const Vec<T, V> gv = reinterpret_cast<const Vec<T, V>*>(g)[i], av = reinterpret_cast<const Vec<T, V>*>(a)[i],
                    bv = reinterpret_cast<const Vec<T, V>*>(b)[i];
    Vec<T, V> dav, dbv;
#pragma unroll
    for (int j = 0; j < V; ++j) one(gv.v[j], av.v[j], bv.v[j], dav.v[j], dbv.v[j]);
    reinterpret_cast<Vec<T, V>*>(da)[i] = dav;
    reinterpret_cast<Vec<T, V>*>(db)[i] = dbv;
  }
  for (int64_t i = nvec * V + tid; i < n; i += step) one(g[i], a[i], b[i], da[i], db[i]);
}

template <class T> struct WhereFn {
  __device__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

// The integer dtypes neg/abs/relu keep (floating dtypes go through dispatch_float).
template <class F> void dispatch_integer(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    default: FORGE_THROW(op, ": not supported for ", dtype_name(t), " tensors");
  }
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, Tensor& out) {
  const char* name = unary_name(op);
  dispatch_unary(op, [&]<UnaryOp Op>() {
    if (is_floating(x.dtype())) {
      dispatch_float(x.dtype(), name, [&]<class T>() { launch_elementwise<1, T, T>(name, UnaryFn<Op, T>{}, out, {&x}); });
    } else if constexpr (Op == UnaryOp::neg || Op == UnaryOp::abs || Op == UnaryOp::relu) {
      dispatch_integer(x.dtype(), name, [&]<class T>() { launch_elementwise<1, T, T>(name, UnaryFn<Op, T>{}, out, {&x}); });
    } else {
      FORGE_THROW(name, ": expected a floating dtype, got ", dtype_name(x.dtype()));
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& out) {
  const char* name = unary_name(op);
  dispatch_unary(op, [&]<UnaryOp Op>() {
    dispatch_float(g.dtype(), name, [&]<class T>() {
      launch_elementwise<3, T, T, T, T>(name, UnaryGradFn<Op, T>{}, out, {&g, &x, &y});
    });
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha) {
  const char* name = binary_name(op);
  dispatch_binary(op, [&]<BinaryOp Op>() {
    if constexpr (kIsComparison<Op>) {
      dispatch_all(a.dtype(), name, [&]<class T>() {
        BinaryFn<Op, T> f{};
        launch_elementwise<2, bool, T, T>(name, f, out, {&a, &b});
      });
    } else {
      dispatch_numeric(a.dtype(), name, [&]<class T>() {
        BinaryFn<Op, T> f{};
        f.f.alpha = alpha;
        launch_elementwise<2, T, T, T>(name, f, out, {&a, &b});
      });
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_all(a.dtype(), "where", [&]<class T>() {
    launch_elementwise<3, T, bool, T, T>("where", WhereFn<T>{}, out, {&cond, &a, &b});
  });
}

bool swiglu_fast_math() { return env::flag("FORGE_SWIGLU_FAST"); }

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  dispatch_float(gate.dtype(), "swiglu", [&]<class T>() {
    if constexpr (is_half_v<T>) {
      if (swiglu_fast_math()) return launch_elementwise<2, T, T, T>("swiglu", FastSwiGluFn<T>{}, out, {&gate, &up});
    }
    launch_elementwise<2, T, T, T>("swiglu", SwiGluFn<T>{}, out, {&gate, &up});
  });
}

void swiglu_backward(const Tensor& g, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  dispatch_float(gate.dtype(), "swiglu_backward", [&]<class T>() {
    // Both gradients in one pass where every operand is contiguous, 16-byte aligned and of one
    // shape and dtype (Note [one-pass SwiGLU backward]); else the two elementwise launches.
    const std::array<const Tensor*, 5> all{&g, &gate, &up, &dgate, &dup};
    bool fused = dgate.defined() && dup.defined();
    for (const Tensor* t : all)
      fused = fused && t->is_cuda() && t->device() == gate.device() && t->dtype() == gate.dtype() &&
              t->shape() == gate.shape() && t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
    if (fused) {
      const int64_t n = gate.numel();
      if (n == 0) return;
      const int device = gate.device().index;
      DeviceGuard guard(device);
      constexpr int64_t V = 16 / sizeof(T) > 0 ? static_cast<int64_t>(16 / sizeof(T)) : 1;
      const int64_t work = std::max<int64_t>((n + V - 1) / V, 1);
      auto kernel = swiglu_backward_kernel<T, false>;
      // Note [one wave of grid-stride blocks] (loops.cuh): the resident blocks, once per kernel.
      static const int per_sm = resident_blocks_per_sm(swiglu_backward_kernel<T, false>, kBlockSize);
      int resident = per_sm;
      if constexpr (is_half_v<T>) {
        static const int fast_per_sm = resident_blocks_per_sm(swiglu_backward_kernel<T, true>, kBlockSize);
        if (swiglu_fast_math()) {
          kernel = swiglu_backward_kernel<T, true>;
          resident = fast_per_sm;
        }
      }
      const int64_t blocks = std::min<int64_t>((work + kBlockSize - 1) / kBlockSize,
                                               static_cast<int64_t>(multiprocessor_count(device)) * resident);
      kernel<<<static_cast<unsigned>(blocks), kBlockSize, 0, current_stream(device)>>>(
          static_cast<const T*>(g.data_ptr()), static_cast<const T*>(gate.data_ptr()),
          static_cast<const T*>(up.data_ptr()), static_cast<T*>(dgate.data_ptr()), static_cast<T*>(dup.data_ptr()), n);
      FORGE_CUDA_LAUNCH_CHECK("swiglu_backward");
      return;
    }
    if (dgate.defined()) launch_elementwise<3, T, T, T, T>("swiglu_backward", SwiGluGradGateFn<T>{}, dgate, {&g, &gate, &up});
    if (dup.defined()) launch_elementwise<2, T, T, T>("swiglu_backward", SwiGluGradUpFn<T>{}, dup, {&g, &gate});
  });
}

}  // namespace forge::cuda
