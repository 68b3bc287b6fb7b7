// forge::parallel on NCCL (CUDA tensors): Note [NCCL groups] in nccl_group.h.
#include "forge/parallel/nccl_group.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"

namespace forge::parallel {

using cuda::DeviceGuard;
using cuda::Event;
using cuda::Stream;
using cuda::StreamGuard;
using cuda::record_stream;

namespace {

using parallel::ReduceOp;
using parallel::WorkPtr;

std::string result_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += std::string(" (") + last + ")";
  return s;
}

// FORGE_DIST_TIMEOUT (core/env.h): seconds a Work::synchronize() waits before aborting
// (default 300).
double timeout_seconds() { return env::real("FORGE_DIST_TIMEOUT"); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    default: FORGE_THROW("NCCL: dtype ", dtype_name(t), " has no NCCL datatype");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  FORGE_THROW("NCCL: unknown ReduceOp");
}

char* bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = bytes(a);
  const char* b0 = bytes(b);
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// Whether `part` is exactly slice `r` (of n elements) of `whole` (NCCL's in-place layout);
// any other overlap is refused.
bool own_slot(const Tensor& whole, const Tensor& part, int r, int64_t n, const char* op, const char* whole_name) {
  if (!overlaps(whole, part)) return false;
  FORGE_CHECK(bytes(part) == bytes(whole) + static_cast<size_t>(r) * n * part.element_size(), op,
              ": the single-rank tensor overlaps the ", whole_name, " other than at this rank's slice [", r * n, ", ",
              (r + 1) * n, "); pass that exact slice (in place) or separate memory");
  return true;
}

// One communicator. Destroyed with the last group or Work that uses it; aborted (once) when
// an operation fails or times out, after which every use throws.
//
// Note [NCCL watchdog]. A Work::wait() is a stream wait, so a collective that never completes
// (a peer dead, stuck or not making the matching call) would otherwise block the host in its
// next synchronisation forever. Every operation's completion event is therefore also watched
// by a thread of the communicator, which polls the oldest unfinished one about every 50 ms
// (and NCCL's asynchronous error): past FORGE_DIST_TIMEOUT seconds, or on an asynchronous
// error, it prints what did not complete, on which rank, and ends the process (exit code 3),
// so the launcher stops the job and names the rank, like PyTorch's NCCL watchdog. The thread
// holds only the events, never the tensors, so memory is freed as before.
// The watchdog's own CUDA calls can block too: a call that synchronises the device (a
// cudaFree, a blocking copy) waits behind the stuck collective and may hold the driver's lock
// that cudaEventQuery needs. So a second thread, which makes no CUDA call, watches the
// watchdog's heartbeat: no heartbeat for FORGE_DIST_TIMEOUT seconds ends the process the same
// way (measured on two H200s: the first version, without it, hung with a stuck peer).
struct NcclComm {
  ncclComm_t comm = nullptr;
  int device = 0, rank = 0, size = 1;
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string abort_reason;

  struct Watched {
    std::shared_ptr<Event> done;
    std::chrono::steady_clock::time_point start;
    const char* op;
  };
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  std::deque<Watched> watched;
  std::thread watchdog;
  bool watch_stop = false;
  double watch_limit = 0;  // FORGE_DIST_TIMEOUT, read (and checked) by the first watch()
  std::thread monitor;
  std::atomic<int64_t> heartbeat_ns{0};  // steady_clock of the watchdog's last completed poll
  std::atomic<bool> monitor_stop{false};

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  [[noreturn]] void end_process(const std::string& why) {
    std::fprintf(stderr, "forge: NCCL watchdog: %s; ending this process (exit code 3)\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }

  NcclComm(ncclComm_t c, int dev, int r, int s) : comm(c), device(dev), rank(r), size(s) {}

  void watch(std::shared_ptr<Event> done, const char* op) {
    const double limit = watchdog.joinable() ? 0 : timeout_seconds();
    std::lock_guard<std::mutex> lock(watch_mu);
    watched.push_back({std::move(done), std::chrono::steady_clock::now(), op});
    if (!watchdog.joinable()) {
      watch_limit = limit;
      heartbeat_ns = now_ns();
      watchdog = std::thread([this] { run_watchdog(); });
      monitor = std::thread([this] { run_monitor(); });
    }
  }

  // Makes no CUDA or NCCL call (Note [NCCL watchdog]).
  void run_monitor() {
    const auto limit_ns = static_cast<int64_t>(watch_limit * 1e9);
    while (!monitor_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t quiet = now_ns() - heartbeat_ns.load();
      if (quiet > limit_ns)
        end_process(forge::detail::concat("rank ", rank, " of ", size, " (cuda:", device, "): the watchdog has been blocked in a ",
                                          "CUDA call for ", static_cast<double>(quiet) * 1e-9, " s (FORGE_DIST_TIMEOUT = ",
                                          watch_limit, " s): the device is stuck, most likely behind a collective that ",
                                          "never completes (a peer dead, stuck or not making the matching call)"));
    }
  }

  void run_watchdog() {
    cudaSetDevice(device);
    const double limit = watch_limit;
    std::unique_lock<std::mutex> lock(watch_mu);
    while (!watch_stop) {
      heartbeat_ns = now_ns();
      watch_cv.wait_for(lock, std::chrono::milliseconds(50));
      try {
        while (!watched.empty() && watched.front().done->query()) watched.pop_front();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "forge: NCCL watchdog on rank %d: %s; ending this process (exit code 3)\n", rank, e.what());
        std::fflush(stderr);
        std::_Exit(3);
      }
      if (watched.empty() || aborted.load()) continue;
      std::string failure;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        failure = where(watched.front().op) + " failed asynchronously (a peer died or the network failed): " +
                  result_text(async, comm);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - watched.front().start).count();
      if (failure.empty() && waited > limit)
        failure = forge::detail::concat(where(watched.front().op), " did not complete within ", limit,
                                        " s (FORGE_DIST_TIMEOUT): a peer is dead, stuck or never made the matching call");
      if (failure.empty()) continue;
      end_process(failure);
    }
  }

  ~NcclComm() {
    if (watchdog.joinable()) {
      {
        std::lock_guard<std::mutex> lock(watch_mu);
        watch_stop = true;
      }
      watch_cv.notify_all();
      watchdog.join();
      monitor_stop = true;
      monitor.join();
    }
    if (comm == nullptr || aborted.load()) return;
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    ncclCommDestroy(comm);
    if (previous >= 0) cudaSetDevice(previous);
    (void)cudaGetLastError();
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string where(const char* op) const {
    return forge::detail::concat("NCCL: ", op, " on rank ", rank, " of ", size, " (cuda:", device, ")");
  }
  // Aborts the communicator (its kernels exit) and throws `why`.
  [[noreturn]] void abort_and_throw(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!aborted.exchange(true)) {
        abort_reason = why;
        DeviceGuard g(device);
        ncclCommAbort(comm);
      }
    }
    throw Error(why + "; the communicator was aborted");
  }
  void check_usable(const char* op) {
    if (!aborted.load()) return;
    std::lock_guard<std::mutex> lock(mu);
    FORGE_THROW(where(op), ": the communicator was aborted after an earlier failure (", abort_reason,
                "); create a new group (a new job)");
  }
  void check(ncclResult_t r, const char* op) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    abort_and_throw(where(op) + " failed: " + result_text(r, comm));
  }
  // A peer's failure or a network error reported while operations run.
  void check_async(const char* op) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess) abort_and_throw(where(op) + ": ncclCommGetAsyncError failed: " + result_text(r, comm));
    if (async != ncclSuccess && async != ncclInProgress)
      abort_and_throw(where(op) + " failed asynchronously (a peer died or the network failed): " +
                      result_text(async, comm));
  }
};

class NcclWork final : public parallel::Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, const char* op, std::vector<Tensor> tensors, bool host_wait)
      : comm_(std::move(comm)), op_(op), tensors_(std::move(tensors)), host_wait_(host_wait) {}

  Event& done_event() { return *done_; }
  const std::shared_ptr<Event>& done_ptr() const { return done_; }

  void wait() override {
    if (host_wait_) {
      synchronize();
      return;
    }
    comm_->check_usable(op_);
    comm_->check_async(op_);
    done_->wait(Stream::current(comm_->device));
  }

  void synchronize() override {
    const double limit = timeout_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      comm_->check_usable(op_);
      if (done_->query()) break;
      comm_->check_async(op_);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > limit)
        comm_->abort_and_throw(forge::detail::concat(comm_->where(op_), " did not complete within ", limit,
                                              " s (FORGE_DIST_TIMEOUT): a peer is dead, stuck or never made the "
                                              "matching call"));
      // Spin briefly for short operations, then poll about once a millisecond.
      if (polls < 200) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    tensors_.clear();
  }

  bool is_completed() override {
    comm_->check_usable(op_);
    if (done_->query()) return true;
    comm_->check_async(op_);
    return false;
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  const char* op_;
  std::vector<Tensor> tensors_;  // alive until synchronize(); record_stream guards reuse anyway
  bool host_wait_;
  std::shared_ptr<Event> done_ = std::make_shared<Event>();
};

// FORGE_NCCL_HIGH_PRIORITY=1 (core/env.h): the communication stream gets the device's highest
// priority, so the block scheduler starts a collective's CTAs ahead of queued compute blocks
// (like PyTorch's TORCH_NCCL_HIGH_PRIORITY). Off by default; benchmarks/dist/run_dist.sh
// measures both.
static int comm_stream_priority() {
  return env::flag("FORGE_NCCL_HIGH_PRIORITY") ? -1000 : 0;  // clamped to the device's range
}

class NcclGroup final : public parallel::ProcessGroup {
 public:
  explicit NcclGroup(std::shared_ptr<NcclComm> comm)
      : ProcessGroup(comm->rank, comm->size),
        comm_(std::move(comm)),
        stream_(Stream::create(comm_->device, comm_stream_priority())) {
    // The barrier's one element belongs to the communication stream (allocated while it is current).
    StreamGuard g(stream_);
    barrier_buf_ = forge::zeros({1}, {.dtype = DType::f32, .device = device()});
  }

  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(comm_->device); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    parallel::detail::check_tensor(*this, "all_reduce", "t", t);
    parallel::detail::check_reduce_op("all_reduce", op, t.dtype());
    return run("all_reduce", {t}, [&](ncclComm_t c, cudaStream_t s) {
      if (t.numel() == 0) return ncclSuccess;
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), count(t), nccl_type(t.dtype()), nccl_op(op), c, s);
    });
  }

  WorkPtr reduce(const Tensor& t, int root, ReduceOp op) override {
    parallel::detail::check_rank(*this, "reduce", "root", root);
    parallel::detail::check_tensor(*this, "reduce", "t", t);
    parallel::detail::check_reduce_op("reduce", op, t.dtype());
    return run("reduce", {t}, [&](ncclComm_t c, cudaStream_t s) {
      if (t.numel() == 0) return ncclSuccess;
      return ncclReduce(t.data_ptr(), t.data_ptr(), count(t), nccl_type(t.dtype()), nccl_op(op), root, c, s);
    });
  }

  WorkPtr broadcast(const Tensor& t, int root) override {
    parallel::detail::check_rank(*this, "broadcast", "root", root);
    parallel::detail::check_tensor(*this, "broadcast", "t", t);
    return run("broadcast", {t}, [&](ncclComm_t c, cudaStream_t s) {
      if (t.numel() == 0) return ncclSuccess;
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), count(t), nccl_type(t.dtype()), root, c, s);
    });
  }

  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    parallel::detail::check_all_gather(*this, output, input);
    own_slot(output, input, rank(), input.numel(), "all_gather", "output");  // in place is NCCL's own layout
    return run("all_gather", {output, input}, [&](ncclComm_t c, cudaStream_t s) {
      if (input.numel() == 0) return ncclSuccess;
      return ncclAllGather(input.data_ptr(), output.data_ptr(), count(input), nccl_type(input.dtype()), c, s);
    });
  }

  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    parallel::detail::check_reduce_scatter(*this, output, input, op);
    own_slot(input, output, rank(), output.numel(), "reduce_scatter", "input");
    return run("reduce_scatter", {output, input}, [&](ncclComm_t c, cudaStream_t s) {
      if (output.numel() == 0) return ncclSuccess;
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), count(output), nccl_type(input.dtype()),
                               nccl_op(op), c, s);
    });
  }

  WorkPtr gather(const Tensor& output, const Tensor& input, int root) override {
    parallel::detail::check_gather(*this, output, input, root);
    const bool is_root = rank() == root;
    if (is_root) own_slot(output, input, rank(), input.numel(), "gather", "output");
    const size_t n = count(input), slice = n * input.element_size();
    const ncclDataType_t dt = nccl_type(input.dtype());
    return run("gather", {is_root ? output : Tensor(), input}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      if (!is_root) return ncclSend(input.data_ptr(), n, dt, root, c, s);
      char* own = bytes(output) + root * slice;
      if (own != bytes(input)) FORGE_CUDA_CHECK(cudaMemcpyAsync(own, input.data_ptr(), slice, cudaMemcpyDeviceToDevice, s));
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p)
        if (p != root) r = ncclRecv(bytes(output) + p * slice, n, dt, p, c, s);
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  WorkPtr scatter(const Tensor& output, const Tensor& input, int root) override {
    parallel::detail::check_scatter(*this, output, input, root);
    const bool is_root = rank() == root;
    if (is_root) own_slot(input, output, rank(), output.numel(), "scatter", "input");
    const size_t n = count(output), slice = n * output.element_size();
    const ncclDataType_t dt = nccl_type(output.dtype());
    return run("scatter", {output, is_root ? input : Tensor()}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      if (!is_root) return ncclRecv(output.data_ptr(), n, dt, root, c, s);
      const char* own = bytes(input) + root * slice;
      if (own != bytes(output)) FORGE_CUDA_CHECK(cudaMemcpyAsync(output.data_ptr(), own, slice, cudaMemcpyDeviceToDevice, s));
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p)
        if (p != root) r = ncclSend(bytes(input) + p * slice, n, dt, p, c, s);
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  WorkPtr all_to_all(const Tensor& output, const Tensor& input) override {
    parallel::detail::check_all_to_all(*this, output, input);
    const size_t n = count(input) / static_cast<size_t>(size()), slice = n * input.element_size();
    const ncclDataType_t dt = nccl_type(input.dtype());
    return run("all_to_all", {output, input}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      // One group of W sends and W receives (the own block included: NCCL copies it locally).
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        r = ncclSend(bytes(input) + p * slice, n, dt, p, c, s);
        if (r == ncclSuccess) r = ncclRecv(bytes(output) + p * slice, n, dt, p, c, s);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  WorkPtr send(const Tensor& t, int dst, int) override {
    parallel::detail::check_peer(*this, "send", "dst", dst);
    parallel::detail::check_tensor(*this, "send", "t", t);
    return run("send", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return t.numel() == 0 ? ncclSuccess : ncclSend(t.data_ptr(), count(t), nccl_type(t.dtype()), dst, c, s);
    });
  }

  WorkPtr recv(const Tensor& t, int src, int) override {
    parallel::detail::check_peer(*this, "recv", "src", src);
    parallel::detail::check_tensor(*this, "recv", "t", t);
    return run("recv", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return t.numel() == 0 ? ncclSuccess : ncclRecv(t.data_ptr(), count(t), nccl_type(t.dtype()), src, c, s);
    });
  }

  WorkPtr barrier() override {
    const Tensor& b = barrier_buf_;
    return run(
        "barrier", {b},
        [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(b.data_ptr(), b.data_ptr(), 1, ncclFloat32, ncclSum, c, s); },
        /*host_wait=*/true);
  }

  void watch_replayed_work(const char* what) override {
    DeviceGuard g(comm_->device);
    auto done = std::make_shared<Event>();
    done->record(Stream::current(comm_->device));
    comm_->watch(std::move(done), what);
  }

  std::shared_ptr<parallel::ProcessGroup> new_group(const std::vector<int>& ranks) override {
    const std::vector<int> members = parallel::detail::check_group_ranks(*this, ranks);
    comm_->check_usable("new_group");
    const auto it = std::find(members.begin(), members.end(), rank());
    const bool member = it != members.end();
    DeviceGuard g(comm_->device);
    ncclComm_t sub = nullptr;
    comm_->check(ncclCommSplit(comm_->comm, member ? 0 : NCCL_SPLIT_NOCOLOR,
                               member ? static_cast<int>(it - members.begin()) : 0, &sub, nullptr),
                 "new_group (ncclCommSplit)");
    if (!member) return nullptr;
    FORGE_CHECK(sub != nullptr, comm_->where("new_group"), ": ncclCommSplit returned no communicator");
    int r = 0, s = 0;
    ncclCommUserRank(sub, &r);
    ncclCommCount(sub, &s);
    return std::make_shared<NcclGroup>(std::make_shared<NcclComm>(sub, comm_->device, r, s));
  }

 private:
  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

  // The common path of every operation (Note [NCCL groups]).
  template <class Launch>
  WorkPtr run(const char* op, std::vector<Tensor> tensors, Launch&& launch, bool host_wait = false) {
    comm_->check_usable(op);
    DeviceGuard g(comm_->device);
    Event ready;
    ready.record(Stream::current(comm_->device));
    ready.wait(stream_);
    for (const Tensor& t : tensors)
      if (t.defined()) record_stream(t, stream_);
    comm_->check(launch(comm_->comm, stream_.handle()), op);
    auto w = std::make_shared<NcclWork>(comm_, op, std::move(tensors), host_wait);
    w->done_event().record(stream_);
    // Note [NCCL watchdog]. An operation captured in a CUDA graph runs only when the graph is
    // replayed, and its event may not be queried before: the replay is watched instead
    // (watch_replayed_work).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    FORGE_CUDA_CHECK(cudaStreamIsCapturing(stream_.handle(), &capture));
    if (capture == cudaStreamCaptureStatusNone) comm_->watch(w->done_ptr(), op);
    return w;
  }

  std::shared_ptr<NcclComm> comm_;
  Stream stream_;
  Tensor barrier_buf_;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

ncclUniqueId decode_id(const std::string& hex) {
  check_nccl_id_hex(hex, "NCCL id");
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i)
    id.internal[i] = static_cast<char>(hex_value(hex[2 * i]) * 16 + hex_value(hex[2 * i + 1]));
  return id;
}

}  // namespace

std::string new_nccl_id_hex() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  FORGE_CHECK(r == ncclSuccess, "NCCL: ncclGetUniqueId failed: ", result_text(r, nullptr),
              " (NCCL needs a usable network interface for its bootstrap, even on one host; see NCCL_SOCKET_IFNAME)");
  static const char* digits = "0123456789abcdef";
  std::string hex(2 * NCCL_UNIQUE_ID_BYTES, '0');
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    const auto b = static_cast<unsigned char>(id.internal[i]);
    hex[2 * i] = digits[b >> 4];
    hex[2 * i + 1] = digits[b & 15];
  }
  return hex;
}

void check_nccl_id_hex(const std::string& hex, const char* where) {
  FORGE_CHECK(hex.size() == 2 * NCCL_UNIQUE_ID_BYTES, where, ": expected a hex-encoded NCCL id of ",
              2 * NCCL_UNIQUE_ID_BYTES, " digits, got ", hex.size(), " characters");
  for (size_t i = 0; i < hex.size(); ++i)
    FORGE_CHECK(hex_value(hex[i]) >= 0, where, ": character ", i, " ('", hex[i], "') is not a hex digit");
}

ProcessGroupPtr make_nccl_group(const std::string& id_hex, int rank, int size, int device) {
  const ncclUniqueId id = decode_id(id_hex);
  FORGE_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL: rank ", rank, " outside a group of ", size);
  DeviceGuard g(device);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, size, id, rank);
  FORGE_CHECK(r == ncclSuccess, "NCCL: ncclCommInitRank (rank ", rank, " of ", size, " on cuda:", device,
              ") failed: ", result_text(r, comm),
              "; check that every rank got the same id and uses its own GPU (NCCL_DEBUG=INFO tells more)");
  return std::make_shared<NcclGroup>(std::make_shared<NcclComm>(comm, device, rank, size));
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace forge::parallel
