// Basic CUDA kernels every op builds on: copy (host<->device, device<->device, any
// dtypes, any strides), fill, arange and the Philox random fills. The counterparts of
// backends/cpu/tensor_kernels.cpp, and bit-compatible with them.
//
// Math:
//   copy     dst[i] = convert<dst dtype>(src[i])                  (core/convert.h)
//   fill     t[i] = convert<T>(value)
//   arange   t[i] = convert<T>(start + double(i) * step)          (in double, as the CPU)
//   uniform  t[i] = convert<T>(lo + (hi - lo) * u_i)              u_i = philox_uniform(w_i)
//   normal   t[i] = convert<T>(mean + std * n_i)                  n_i = philox_normal(block, i % 4)
// where block = philox4x32_10(seed, block_offset + i / 4) and w_i its word i % 4
// (Note [RNG streams] in core/philox.h): the same seed gives the CPU's numbers, up to the
// last bits of the device's logf/sinf/cosf in normal. The double-precision affine maps
// are written with __dmul_rn/__dadd_rn so nvcc cannot fuse them into an FMA: rounded
// twice, exactly as the CPU (built without FMA contraction) computes them.
//
// Memory contract: every function overwrites the elements of its output (dst / t) and
// nothing else; sources are only read. arange/uniform/normal need a contiguous output,
// fill and copy take any strides. copy makes temporaries (freed before it returns):
//   same dtype, both contiguous   one cudaMemcpyAsync (a peer copy between GPUs);
//   dst on a GPU                  the source is staged on dst's GPU when it is elsewhere
//                                 (raw bytes, in its own dtype), then one strided
//                                 conversion kernel writes dst;
//   dst on the host               one kernel gathers and converts on the source's GPU into
//                                 a contiguous buffer of dst's dtype, which is copied over
//                                 (and scattered by cpu::copy if dst is strided).
// Every copy and kernel runs on the current stream of the GPU involved. A peer copy
// between GPUs is one cudaMemcpyPeer (ordered with all work of both devices) while both
// current streams are the legacy ones, else a copy on the destination's stream between
// two stream synchronisations. Copies that touch pageable host memory synchronise the
// stream before returning: device->host because the host reads the data next;
// host->device because cudaMemcpyAsync from pageable memory is only documented as "might
// be synchronous", so the source could still be read after the call returns. With
// non_blocking and a pinned host side (the only case where it changes anything) the copy
// is just queued: an event recorded after it keeps the pinned block from reuse until it
// completed (record_pinned_use, pinned.h), and the caller synchronises before reading a
// host destination. Work within one GPU is always asynchronous and stream-ordered.
#include <memory>

#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/pinned.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/backends/cuda/graph.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/philox.h"

namespace forge::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------

template <class To, class From> struct ConvertFn {
  __device__ To operator()(From v) const { return convert<To>(v); }
};

template <class T> struct FillFn {
  T value;
  __device__ T operator()() const { return value; }
};

template <class T>
__global__ void __launch_bounds__(kBlockSize) arange_kernel(T* __restrict__ t,  // (n,)
                                                            int64_t n, double start, double step) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    t[i] = convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
}

struct UniformDist {
  double lo, hi;
  __device__ double operator()(const Philox4& r, int lane) const {
    return __dadd_rn(lo, __dmul_rn(hi - lo, static_cast<double>(philox_uniform(r.v[lane]))));
  }
};

struct NormalDist {
  double mean, std;
  __device__ double operator()(const Philox4& r, int lane) const {
    return __dadd_rn(mean, __dmul_rn(std, static_cast<double>(philox_normal(r, lane))));
  }
};

// One thread per Philox block of four elements.
template <class T, class Dist>
__global__ void __launch_bounds__(kBlockSize) philox_kernel(T* __restrict__ t,  // (n,)
                                                            int64_t n, uint64_t seed, uint64_t block_offset,
                                                            Dist dist) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const Philox4 r = philox4x32_10(seed, block_offset + static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = 4 * b + lane;
      if (i < n) t[i] = convert<T>(dist(r, lane));
    }
  }
}

// ---- host helpers --------------------------------------------------------------------

unsigned grid_for(int device, int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSm;
  return static_cast<unsigned>(std::min<int64_t>((work + kBlockSize - 1) / kBlockSize, max_blocks));
}

// A new contiguous tensor on `device` (backends sit below ops/, so no forge::empty here).
Tensor empty_on(Device device, const Shape& shape, DType dtype) {
  Allocator* a = device.is_cpu() ? cpu_allocator() : allocator(device.index);
  auto storage = std::make_shared<Storage>(checked_nbytes(shape, element_size(dtype)), a);
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

// The host side's storage when the copy between `a` and `b` may stay asynchronous: one side
// on the host, in pinned memory, and the caller asked for non_blocking. Else nullptr.
const Storage* async_host(const Tensor& a, const Tensor& b, bool non_blocking) {
  if (!non_blocking) return nullptr;
  const Tensor& host = a.is_cpu() ? a : b;
  return host.is_cpu() && host.is_pinned() ? host.storage().get() : nullptr;
}

// Moves `n` raw bytes between any two of host / GPU a / GPU b. `pinned_host`: the host
// side's pinned storage if the copy may stay asynchronous (async_host), else nullptr.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n,
                const Storage* pinned_host = nullptr) {
  if (n == 0) return;
  if (dst_dev.is_cuda() && src_dev.is_cuda()) {
    if (dst_dev.index == src_dev.index) {
      DeviceGuard guard(dst_dev.index);
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, current_stream(dst_dev.index)));
    } else {
      const cudaStream_t src_stream = current_stream(src_dev.index), dst_stream = current_stream(dst_dev.index);
      if (src_stream == nullptr && dst_stream == nullptr) {
        // Ordered after the pending work of both devices and before their later work.
        FORGE_CUDA_CHECK(cudaMemcpyPeer(dst, dst_dev.index, src, src_dev.index, n));
      } else {
        // A stream of forge's own is current on one side (a StreamGuard): order by hand.
        // The source's pending writes first; then the copy on the destination's stream,
        // waited for, so the source (often a temporary) may be freed or reused at once.
        {
          DeviceGuard guard(src_dev.index);
          FORGE_CUDA_CHECK(cudaStreamSynchronize(src_stream));
        }
        DeviceGuard guard(dst_dev.index);
        FORGE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, n, dst_stream));
        FORGE_CUDA_CHECK(cudaStreamSynchronize(dst_stream));
      }
    }
    return;
  }
  const int device = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const cudaMemcpyKind kind = dst_dev.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream));
  if (pinned_host != nullptr) {
    record_pinned_use(pinned_host->data(), stream, device);
    return;
  }
  // The host side is memory the caller may read, reuse or free as soon as we return.
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// dst <- convert(src): both on one GPU, same shape, any strides and dtypes.
void convert_on_device(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), "copy", [&]<class To>() {
    dispatch_all(src.dtype(), "copy", [&]<class From>() {
      launch_elementwise<1, To, From>("copy", ConvertFn<To, From>{}, dst, {&src});
    });
  });
}

// `src` readable on GPU `device`, in its own dtype and shape: src itself when it is
// already there, else a staged copy (contiguous, or a view over a staged storage span).
Tensor stage_on(const Tensor& src, int device, bool non_blocking) {
  const Device to = Device::cuda(device);
  if (src.device() == to) return src;
  if (src.is_cuda()) {  // another GPU: gather there, then one peer copy
    Tensor packed = src;
    if (!src.is_contiguous()) {
      packed = empty_on(src.device(), src.shape(), src.dtype());
      convert_on_device(packed, src);
    }
    Tensor out = empty_on(to, src.shape(), src.dtype());
    copy_bytes(out.data_ptr(), to, packed.data_ptr(), src.device(), out.nbytes());
    return out;
  }
  const Storage* pinned = async_host(src, src, non_blocking);
  if (src.is_contiguous()) {
    Tensor out = empty_on(to, src.shape(), src.dtype());
    copy_bytes(out.data_ptr(), to, src.data_ptr(), src.device(), out.nbytes(), pinned);
    return out;
  }
  // A strided host tensor: when the storage span its elements cover is at most twice its
  // size (broadcast, transposed and permuted views), move that span as it is and keep the
  // strides; otherwise (a sparse slice of a big buffer) gather it on the host first.
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < src.dim(); ++d) {
    const int64_t reach = (src.size(d) - 1) * src.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t span = hi - lo + 1;
  if (span <= 2 * src.numel()) {
    const size_t es = src.element_size();
    auto storage = std::make_shared<Storage>(static_cast<size_t>(span) * es, allocator(device));
    const char* first = static_cast<const char*>(src.data_ptr()) + lo * static_cast<int64_t>(es);
    copy_bytes(storage->data(), to, first, src.device(), static_cast<size_t>(span) * es, pinned);
    return Tensor::make(std::move(storage), src.shape(), src.strides(), -lo, src.dtype());
  }
  Tensor host = empty_on(Device::cpu(), src.shape(), src.dtype());
  cpu::copy(host, src);
  Tensor out = empty_on(to, src.shape(), src.dtype());
  copy_bytes(out.data_ptr(), to, host.data_ptr(), host.device(), out.nbytes());
  return out;
}

template <class Dist> void philox_fill(Tensor& t, const char* op, uint64_t seed, uint64_t block_offset, Dist dist) {
  FORGE_CHECK(t.is_cuda() && t.is_contiguous(), op, ": output must be a contiguous CUDA tensor, got shape ", t.shape(),
              " strides ", t.strides(), " on ", t.device().str());
  const int64_t n = t.numel();
  if (n == 0) return;
  const int device = t.device().index;
  DeviceGuard guard(device);
  // The seed and offset are the host generator's at this call: a CUDA graph replay would draw the
  // same numbers every time (dropout in a captured step: Note [the step as a CUDA graph]).
  check_not_capturing(t.device().index, op, "its random seed comes from the host generator at each call, so every "
                      "replay would draw the same numbers");
  dispatch_float(t.dtype(), op, [&]<class T>() {
    philox_kernel<T, Dist><<<grid_for(device, (n + 3) / 4), kBlockSize, 0, current_stream(device)>>>(
        static_cast<T*>(t.data_ptr()), n, seed, block_offset, dist);
  });
  FORGE_CUDA_LAUNCH_CHECK(op, " on ", t.device().str(), ": out ", t.shape(), " ", dtype_name(t.dtype()));
}

}  // namespace

// ---- entry points --------------------------------------------------------------------

void copy(Tensor& dst, const Tensor& src, bool non_blocking) {
  FORGE_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape(), " != source shape ", src.shape());
  FORGE_CHECK(dst.is_cuda() || src.is_cuda(), "cuda::copy: neither side is on a GPU (", dst.device().str(), " <- ",
              src.device().str(), ")");
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr() || dst.device() != src.device())
      copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes(),
                 async_host(dst, src, non_blocking));
    return;
  }
  if (dst.is_cuda()) {
    convert_on_device(dst, stage_on(src, dst.device().index, non_blocking));
    return;
  }
  // dst on the host, src on a GPU.
  Tensor packed = src;
  if (!(src.is_contiguous() && src.dtype() == dst.dtype())) {
    packed = empty_on(src.device(), src.shape(), dst.dtype());
    convert_on_device(packed, src);
  }
  if (dst.is_contiguous()) {
    copy_bytes(dst.data_ptr(), dst.device(), packed.data_ptr(), packed.device(), dst.nbytes(),
               async_host(dst, src, non_blocking));
  } else {  // gathered on the host, so the host needs the data now: a blocking copy
    Tensor host = empty_on(Device::cpu(), dst.shape(), dst.dtype());
    copy_bytes(host.data_ptr(), host.device(), packed.data_ptr(), packed.device(), host.nbytes());
    cpu::copy(dst, host);
  }
}

void fill(Tensor& t, double value) {
  dispatch_all(t.dtype(), "fill", [&]<class T>() {
    launch_elementwise<0, T>("fill", FillFn<T>{convert<T>(value)}, t, {});
  });
}

void arange(Tensor& t, double start, double step) {
  FORGE_CHECK(t.is_cuda() && t.is_contiguous(), "arange: output must be a contiguous CUDA tensor, got shape ",
              t.shape(), " strides ", t.strides(), " on ", t.device().str());
  const int64_t n = t.numel();
  if (n == 0) return;
  const int device = t.device().index;
  DeviceGuard guard(device);
  dispatch_numeric(t.dtype(), "arange", [&]<class T>() {
    arange_kernel<T><<<grid_for(device, n), kBlockSize, 0, current_stream(device)>>>(static_cast<T*>(t.data_ptr()), n,
                                                                                      start, step);
  });
  FORGE_CUDA_LAUNCH_CHECK("arange on ", t.device().str(), ": out ", t.shape(), " ", dtype_name(t.dtype()));
}

void uniform(Tensor& t, double lo, double hi, uint64_t seed, uint64_t block_offset) {
  philox_fill(t, "rand", seed, block_offset, UniformDist{lo, hi});
}

void normal(Tensor& t, double mean, double std, uint64_t seed, uint64_t block_offset) {
  philox_fill(t, "randn", seed, block_offset, NormalDist{mean, std});
}

}  // namespace forge::cuda
