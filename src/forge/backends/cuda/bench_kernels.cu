// Kernels and event timing of forge bench (contract in bench_kernels.h).
#include "forge/backends/cuda/bench_kernels.h"

#include <algorithm>
#include <vector>

#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSmCopy = 8;  // 2048 threads: a full SM, 4 x 16 B loads in flight each

// dst[i] = src[i] for i < n16 (16-byte words), 4 independent loads before the stores; then the
// `tail` bytes after the last word, by block 0.
__global__ void copy16_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n16,
                              const unsigned char* __restrict__ src_tail, unsigned char* __restrict__ dst_tail,
                              int tail) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n16; i += 4 * step) {
    const uint4 a = src[i];
    const uint4 b = src[i + step];
    const uint4 c = src[i + 2 * step];
    const uint4 d = src[i + 3 * step];
    dst[i] = a;
    dst[i + step] = b;
    dst[i + 2 * step] = c;
    dst[i + 3 * step] = d;
  }
  for (; i < n16; i += step) dst[i] = src[i];
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < tail) dst_tail[threadIdx.x] = src_tail[threadIdx.x];
}

__global__ void copy_bytes_kernel(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = src[i];
}

// counter += the words (4 bytes; the trailing 1..3 bytes as one more word) where a and b differ.
__global__ void mismatch_kernel(const unsigned* __restrict__ a, const unsigned* __restrict__ b, int64_t words,
                                const unsigned char* __restrict__ a_tail, const unsigned char* __restrict__ b_tail,
                                int tail, unsigned long long* counter) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += step)
    bad += a[i] != b[i] ? 1ull : 0ull;
  if (blockIdx.x == 0 && threadIdx.x == 0 && tail > 0) {
    bool differ = false;
    for (int k = 0; k < tail; ++k) differ = differ || a_tail[k] != b_tail[k];
    bad += differ ? 1ull : 0ull;
  }
  // Warp sum, then one atomic per warp.
  for (int off = 16; off > 0; off /= 2) bad += __shfl_down_sync(0xffffffffu, bad, off);
  if ((threadIdx.x & 31) == 0 && bad > 0) atomicAdd(counter, bad);
}

__global__ void flip_bit_kernel(unsigned char* p) { *p ^= 1u; }

unsigned grid_for(int device, int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSmCopy;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, max_blocks)));
}

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.is_cuda() && b.is_cuda() && a.device() == b.device(), op, ": expected two tensors on one CUDA device, got ",
              a.device().str(), " and ", b.device().str());
  FORGE_CHECK(a.is_contiguous() && b.is_contiguous(), op, ": expected contiguous tensors");
  FORGE_CHECK(a.nbytes() == b.nbytes(), op, ": byte counts differ: ", a.nbytes(), " vs ", b.nbytes());
}

}  // namespace

void bench_copy_kernel(const Tensor& src, Tensor& dst) {
  check_pair("bench_copy_kernel", src, dst);
  const int device = src.device().index;
  DeviceGuard g(device);
  const auto* s = static_cast<const unsigned char*>(src.data_ptr());
  auto* d = static_cast<unsigned char*>(dst.data_ptr());
  const int64_t n = static_cast<int64_t>(src.nbytes());
  if (n == 0) return;
  cudaStream_t stream = current_stream(device);
  const bool aligned = reinterpret_cast<uintptr_t>(s) % 16 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0;
  if (aligned) {
    const int64_t n16 = n / 16;
    const int tail = static_cast<int>(n - n16 * 16);
    copy16_kernel<<<grid_for(device, n16), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(s),
                                                                  reinterpret_cast<uint4*>(d), n16, s + n16 * 16,
                                                                  d + n16 * 16, tail);
  } else {
    copy_bytes_kernel<<<grid_for(device, n), kThreads, 0, stream>>>(s, d, n);
  }
  FORGE_CUDA_LAUNCH_CHECK("bench_copy_kernel: ", n, " bytes");
}

void bench_copy_memcpy(const Tensor& src, Tensor& dst) {
  check_pair("bench_copy_memcpy", src, dst);
  const int device = src.device().index;
  DeviceGuard g(device);
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                   current_stream(device)));
}

void bench_copy_to_device(const void* host, Tensor& dst, size_t bytes) {
  FORGE_CHECK(dst.is_cuda() && dst.is_contiguous() && bytes <= dst.nbytes(), "bench_copy_to_device: bad destination");
  const int device = dst.device().index;
  DeviceGuard g(device);
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), host, bytes, cudaMemcpyHostToDevice, current_stream(device)));
}

void bench_copy_to_host(const Tensor& src, void* host, size_t bytes) {
  FORGE_CHECK(src.is_cuda() && src.is_contiguous() && bytes <= src.nbytes(), "bench_copy_to_host: bad source");
  const int device = src.device().index;
  DeviceGuard g(device);
  FORGE_CUDA_CHECK(cudaMemcpyAsync(host, src.data_ptr(), bytes, cudaMemcpyDeviceToHost, current_stream(device)));
}

bool bench_enable_peer_access(int device, int peer) {
  int can = 0;
  FORGE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  if (can == 0) return false;
  DeviceGuard g(device);
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // clear the (non-sticky) error this call left behind
    return true;
  }
  FORGE_CUDA_CHECK(err);
  return true;
}

void bench_copy_peer(const Tensor& src, Tensor& dst) {
  FORGE_CHECK(src.is_cuda() && dst.is_cuda() && src.is_contiguous() && dst.is_contiguous() &&
                  src.nbytes() == dst.nbytes(),
              "bench_copy_peer: expected contiguous CUDA tensors of one size");
  const int device = src.device().index;
  DeviceGuard g(device);
  FORGE_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data_ptr(), dst.device().index, src.data_ptr(), device, src.nbytes(),
                                       current_stream(device)));
}

void bench_count_mismatches(const Tensor& a, const Tensor& b, Tensor& counter) {
  check_pair("bench_count_mismatches", a, b);
  FORGE_CHECK(counter.is_cuda() && counter.device() == a.device() && counter.dtype() == DType::i64 &&
                  counter.numel() == 1,
              "bench_count_mismatches: counter must be one i64 on ", a.device().str());
  const int device = a.device().index;
  DeviceGuard g(device);
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
  FORGE_CHECK(reinterpret_cast<uintptr_t>(pa) % 4 == 0 && reinterpret_cast<uintptr_t>(pb) % 4 == 0,
              "bench_count_mismatches: expected 4-byte aligned tensors");
  const int64_t n = static_cast<int64_t>(a.nbytes());
  const int64_t words = n / 4;
  const int tail = static_cast<int>(n - words * 4);
  mismatch_kernel<<<grid_for(device, words), kThreads, 0, current_stream(device)>>>(
      reinterpret_cast<const unsigned*>(pa), reinterpret_cast<const unsigned*>(pb), words, pa + words * 4,
      pb + words * 4, tail, static_cast<unsigned long long*>(counter.data_ptr()));
  FORGE_CUDA_LAUNCH_CHECK("bench_count_mismatches: ", n, " bytes");
}

void bench_flip_bit(Tensor& t, int64_t byte_index) {
  FORGE_CHECK(t.is_cuda() && t.is_contiguous() && byte_index >= 0 && byte_index < static_cast<int64_t>(t.nbytes()),
              "bench_flip_bit: byte ", byte_index, " is outside the tensor");
  const int device = t.device().index;
  DeviceGuard g(device);
  flip_bit_kernel<<<1, 1, 0, current_stream(device)>>>(static_cast<unsigned char*>(t.data_ptr()) + byte_index);
  FORGE_CUDA_LAUNCH_CHECK("bench_flip_bit");
}

// ---- EventMarks ----------------------------------------------------------------------------

struct EventMarks::Impl {
  int device = 0;
  std::vector<Event> events;
};

EventMarks::EventMarks(int device) : impl_(std::make_unique<Impl>()) { impl_->device = device; }
EventMarks::~EventMarks() = default;

void EventMarks::mark() {
  DeviceGuard g(impl_->device);
  impl_->events.emplace_back(true);
  impl_->events.back().record(Stream::current(impl_->device));
}

int EventMarks::size() const { return static_cast<int>(impl_->events.size()); }

void EventMarks::synchronize() const {
  if (!impl_->events.empty()) impl_->events.back().synchronize();
}

double EventMarks::ms(int i, int j) const {
  FORGE_CHECK(0 <= i && i < j && j < size(), "EventMarks::ms: bad marks ", i, ", ", j, " of ", size());
  return static_cast<double>(impl_->events[static_cast<size_t>(i)].elapsed_ms(impl_->events[static_cast<size_t>(j)]));
}

}  // namespace forge::cuda
