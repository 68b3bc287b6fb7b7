// Embedding lookup: CUDA kernels, the counterparts of backends/cpu/embedding.cpp.
//
//   forward   out[n, c]     = weight[ids[n], c]
//   backward  dweight[v, c] = sum over n with ids[n] == v of dout[n, c]
//
//   weight, dweight (V, C)   V rows (the vocabulary), C features
//   ids             (N)      N = B * T positions for token ids (B, T)
//   out, dout       (N, C)   i.e. (B, T, C)
//
// Memory contract: weight, ids and dout are read only. The forward overwrites out; the
// backward overwrites the whole of dweight (rows no id names are zero). Backward scratch:
// 4 int32 arrays of N (keys and positions, before and after the sort), V int32 (the end
// of each id's run) and cub's radix-sort temporary storage.
//
// Note [embedding backward on the device]: a gather per row, as on the CPU, never a
// scatter with atomics, so the result is deterministic and needs no f32 copy of dweight:
//   1. keys[n] = ids[n] (int32, range-checked on the device), pos[n] = n;
//   2. a stable radix sort of (keys, pos) over the ceil(log2 V) low bits (cub): the
//      positions of each id become one run, in increasing n;
//   3. last[id] = the end of each run (written by the run's last element: one writer each);
//   4. dweight is zeroed, then one block per run start (every other block of the grid
//      stride exits at once) sums its run's rows of dout for every column, in f32 (f64 for
//      f64) registers, and writes dweight[id] rounded once. The block's threads are lanes
//      over 16-byte column vectors times R = 256 / lanes groups that take every R-th row
//      of the run; the R partials meet in shared memory in group order. An id that
//      appears once is copied exactly.
// The run sums are in a fixed order (groups, then group order), so the result is
// bit-identical from run to run; it differs from the CPU's (double, in increasing n) only
// by f32 rounding. The cost is a sort of N int32 pairs (~tens of microseconds for N =
// 32768) plus one read of dout and one write of the rows named.
// TODO(perf): a very frequent id (a few percent of GPT-2's tokens) makes one long run
// summed by one block; splitting long runs over blocks (with an ordered second pass) would
// shorten that tail once benchmarks/ shows it matters.
//
// Forward: row groups (Note [row groups] in reduce.cuh) over n, lanes over the row copied
// as raw units of 16 bytes when every row is 16-byte aligned (C * sizeof(T) % 16 == 0),
// else of 4 or 2 bytes.
#include "forge/backends/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include <limits>

#include "forge/backends/cuda/reduce.cuh"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

// ---- forward ------------------------------------------------------------------------------

// Copies row ids[n] of weight (units U per row) to row n of out.
template <class U, class I>
__global__ void __launch_bounds__(kReduceThreads)
    embedding_forward_kernel(const U* __restrict__ weight,  // (V, units)
                             const I* __restrict__ ids,      // (N)
                             int64_t N, int64_t V, int64_t units, int tx,
                             U* __restrict__ out) {  // (N, units)
  const int ty = kReduceThreads / tx;
  const int lane = static_cast<int>(threadIdx.x) % tx, group = static_cast<int>(threadIdx.x) / tx;
  const int64_t groups = (N + ty - 1) / ty;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t n = g * ty + group;
    if (n >= N) continue;
    const int64_t id = static_cast<int64_t>(ids[n]);
    FORGE_KERNEL_CHECK(id >= 0 && id < V, "embedding: id %lld at position %lld is out of range for V = %lld",
                       static_cast<long long>(id), static_cast<long long>(n), static_cast<long long>(V));
    const U* src = weight + id * units;
    U* dst = out + n * units;
    for (int64_t u = lane; u < units; u += tx) dst[u] = src[u];
  }
}

template <class U, class I>
void launch_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t N, int64_t V, int64_t row_bytes) {
  const int device = weight.device().index;
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const RowGroups g = RowGroups::for_work(2 * units);  // about one unit per thread
  const int64_t groups = (N + g.ty - 1) / g.ty;
  embedding_forward_kernel<U, I><<<grid_blocks(device, groups, 32), kReduceThreads, 0, current_stream(device)>>>(
      static_cast<const U*>(weight.data_ptr()), static_cast<const I*>(ids.data_ptr()), N, V, units, g.tx,
      static_cast<U*>(out.data_ptr()));
  FORGE_CUDA_LAUNCH_CHECK("embedding: weight ", weight.shape(), " ", dtype_name(weight.dtype()), ", ids ", ids.shape(),
                          " ", dtype_name(ids.dtype()));
}

// ---- backward -----------------------------------------------------------------------------

template <class I>
__global__ void __launch_bounds__(kReduceThreads)
    embedding_keys_kernel(const I* __restrict__ ids,  // (N)
                          int64_t N, int64_t V,
                          int32_t* __restrict__ keys,  // (N)
                          int32_t* __restrict__ pos) {  // (N)
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += step) {
    const int64_t id = static_cast<int64_t>(ids[n]);
    FORGE_KERNEL_CHECK(id >= 0 && id < V,
                       "embedding_backward: id %lld at position %lld is out of range for V = %lld",
                       static_cast<long long>(id), static_cast<long long>(n), static_cast<long long>(V));
    keys[n] = static_cast<int32_t>(id);
    pos[n] = static_cast<int32_t>(n);
  }
}

// last[id] = the index (in sorted order) of the last element of id's run.
__global__ void __launch_bounds__(kReduceThreads)
    embedding_run_ends_kernel(const int32_t* __restrict__ keys,  // (N) sorted
                              int64_t N,
                              int32_t* __restrict__ last) {  // (V)
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += step)
    if (i == N - 1 || keys[i + 1] != keys[i]) last[keys[i]] = static_cast<int32_t>(i);
}

// One block per run of equal keys (Note [embedding backward on the device]); W elements per
// thread and column vector (kVec<T> when rows are 16-byte aligned, else 1).
template <class T, int W>
__global__ void __launch_bounds__(kReduceThreads)
    embedding_backward_kernel(const T* __restrict__ dout,       // (N, C)
                              const int32_t* __restrict__ keys,  // (N) sorted ids
                              const int32_t* __restrict__ pos,   // (N) their positions
                              const int32_t* __restrict__ last,  // (V) run ends
                              int64_t N, int64_t C,
                              T* __restrict__ dweight) {  // (V, C), zeroed
  using A = acc_t<T>;
  __shared__ A partial[kReduceThreads * W];
  const int64_t cw = C / W;  // column vectors per row
  const int lanes = static_cast<int>(cw < kReduceThreads ? cw : kReduceThreads);
  const int R = kReduceThreads / lanes;  // row groups
  const int lane = static_cast<int>(threadIdx.x) % lanes, r = static_cast<int>(threadIdx.x) / lanes;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t id = keys[i];
    if (i > 0 && keys[i - 1] == id) continue;  // not a run start (uniform over the block)
    const int64_t end = static_cast<int64_t>(last[id]) + 1;
    for (int64_t w0 = 0; w0 < cw; w0 += lanes) {
      const int64_t w = w0 + lane;
      const bool active = r < R && w < cw;
      A acc[W];
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] = A(0);
      if (active) {
#pragma unroll 4
        for (int64_t k = i + r; k < end; k += R) {
          const Vec<T, W> v = reinterpret_cast<const Vec<T, W>*>(dout + static_cast<int64_t>(pos[k]) * C)[w];
#pragma unroll
          for (int e = 0; e < W; ++e) acc[e] += convert<A>(v.v[e]);
        }
      }
      if (R > 1) {  // uniform: R depends on C only
        if (active) {
#pragma unroll
          for (int e = 0; e < W; ++e) partial[threadIdx.x * W + e] = acc[e];
        }
        __syncthreads();
        if (active && r == 0) {
          for (int g = 1; g < R; ++g) {
#pragma unroll
            for (int e = 0; e < W; ++e) acc[e] += partial[(g * lanes + lane) * W + e];
          }
        }
        __syncthreads();
      }
      if (active && r == 0) {
        Vec<T, W> o;
#pragma unroll
        for (int e = 0; e < W; ++e) o.v[e] = convert<T>(acc[e]);
        reinterpret_cast<Vec<T, W>*>(dweight + static_cast<int64_t>(id) * C)[w] = o;
      }
    }
  }
}

int end_bit_for(int64_t V) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < V) ++bits;
  return bits;
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  FORGE_CHECK(weight.is_cuda() && ids.device() == weight.device() && out.device() == weight.device() &&
                  weight.dim() == 2 && weight.is_contiguous() && ids.is_contiguous() && out.is_contiguous() &&
                  out.dtype() == weight.dtype() && out.numel() == ids.numel() * weight.shape()[1],
              "embedding: the CUDA kernel needs a contiguous (V, C) weight, contiguous ids and a contiguous (N, C) "
              "output on one GPU, got weight ", weight.shape(), " on ", weight.device().str(), ", ids ", ids.shape(),
              " on ", ids.device().str(), ", out ", out.shape());
  const int64_t V = weight.shape()[0], C = weight.shape()[1], N = ids.numel();
  if (N == 0 || C == 0) return;
  DeviceGuard guard(weight.device().index);
  const int64_t row_bytes = C * static_cast<int64_t>(weight.element_size());
  const bool aligned = aligned16(weight.data_ptr()) && aligned16(out.data_ptr());
  dispatch_index(ids.dtype(), "embedding", [&]<class I>() {
    if (aligned && row_bytes % 16 == 0) launch_forward<uint4, I>(weight, ids, out, N, V, row_bytes);
    else if (aligned && row_bytes % 4 == 0) launch_forward<uint32_t, I>(weight, ids, out, N, V, row_bytes);
    else if (weight.element_size() == 2) launch_forward<uint16_t, I>(weight, ids, out, N, V, row_bytes);
    else if (weight.element_size() == 4) launch_forward<uint32_t, I>(weight, ids, out, N, V, row_bytes);
    else launch_forward<uint2, I>(weight, ids, out, N, V, row_bytes);  // f64: 8-byte elements
  });
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  FORGE_CHECK(dweight.is_cuda() && ids.device() == dweight.device() && dout.device() == dweight.device() &&
                  dweight.dim() == 2 && dweight.is_contiguous() && ids.is_contiguous() && dout.is_contiguous() &&
                  dout.dtype() == dweight.dtype() && dout.numel() == ids.numel() * dweight.shape()[1],
              "embedding_backward: the CUDA kernel needs a contiguous (N, C) dout, contiguous ids and a contiguous "
              "(V, C) dweight on one GPU, got dout ", dout.shape(), " on ", dout.device().str(), ", ids ", ids.shape(),
              " on ", ids.device().str(), ", dweight ", dweight.shape());
  const int64_t V = dweight.shape()[0], C = dweight.shape()[1], N = ids.numel();
  FORGE_CHECK(N < std::numeric_limits<int32_t>::max() && V < std::numeric_limits<int32_t>::max(),
              "embedding_backward: the CUDA kernel takes fewer than 2^31 ids and rows, got ", N, " ids and V = ", V);
  const int device = dweight.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (dweight.numel() > 0) FORGE_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), stream));
  if (N == 0 || C == 0) return;

  // 1-3: the positions sorted by id, and the end of each id's run.
  const Tensor keys = device_buffer(device, {N}, DType::i32), pos = device_buffer(device, {N}, DType::i32);
  const Tensor sorted_keys = device_buffer(device, {N}, DType::i32), sorted_pos = device_buffer(device, {N}, DType::i32);
  const Tensor last = device_buffer(device, {V}, DType::i32);
  auto* k_in = static_cast<int32_t*>(keys.data_ptr());
  auto* p_in = static_cast<int32_t*>(pos.data_ptr());
  auto* k_out = static_cast<int32_t*>(sorted_keys.data_ptr());
  auto* p_out = static_cast<int32_t*>(sorted_pos.data_ptr());
  const unsigned flat_blocks = grid_blocks(device, (N + kReduceThreads - 1) / kReduceThreads);
  dispatch_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    embedding_keys_kernel<I><<<flat_blocks, kReduceThreads, 0, stream>>>(static_cast<const I*>(ids.data_ptr()), N, V,
                                                                          k_in, p_in);
    FORGE_CUDA_LAUNCH_CHECK("embedding_backward (keys): ids ", ids.shape(), " ", dtype_name(ids.dtype()));
  });
  const int end_bit = end_bit_for(V);
  size_t temp_bytes = 0;
  FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, p_in, p_out, static_cast<int>(N),
                                                   0, end_bit, stream));
  const Tensor temp = device_buffer(device, {static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::u8);
  FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, k_in, k_out, p_in, p_out,
                                                   static_cast<int>(N), 0, end_bit, stream));
  embedding_run_ends_kernel<<<flat_blocks, kReduceThreads, 0, stream>>>(k_out, N,
                                                                        static_cast<int32_t*>(last.data_ptr()));
  FORGE_CUDA_LAUNCH_CHECK("embedding_backward (runs): ", N, " ids");

  // 4: one block per run.
  dispatch_float(dweight.dtype(), "embedding_backward", [&]<class T>() {
    const T* pg = static_cast<const T*>(dout.data_ptr());
    T* pd = static_cast<T*>(dweight.data_ptr());
    constexpr int W = kVec<T>;
    const bool vec = C % W == 0 && aligned16(pg) && aligned16(pd);
    const unsigned blocks = grid_blocks(device, N, 16);
    const auto* lastp = static_cast<const int32_t*>(last.data_ptr());
    if (vec) embedding_backward_kernel<T, W><<<blocks, kReduceThreads, 0, stream>>>(pg, k_out, p_out, lastp, N, C, pd);
    else embedding_backward_kernel<T, 1><<<blocks, kReduceThreads, 0, stream>>>(pg, k_out, p_out, lastp, N, C, pd);
    FORGE_CUDA_LAUNCH_CHECK("embedding_backward: dout ", dout.shape(), " ", dtype_name(dout.dtype()), ", dweight ",
                            dweight.shape());
  });
}

}  // namespace forge::cuda
