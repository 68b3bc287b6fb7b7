// forge::parallel on MPI (CPU tensors): Note [MPI groups] in mpi_group.h.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "forge/parallel/mpi_group.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"

namespace forge::parallel::mpi {

namespace {

// FORGE_DIST_TIMEOUT (core/env.h): seconds a blocking wait lasts before the job is aborted
// (default 300).
double mpi_timeout_seconds() { return env::real("FORGE_DIST_TIMEOUT"); }

bool g_initialised_here = false;

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(buf, static_cast<size_t>(len));
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) FORGE_THROW("MPI: ", what, " failed: ", mpi_error_string(rc));
}

// Throws "MPI: <op> on rank r of W failed: ..." for a failed MPI call of a group operation.
void check_op(int rc, const char* op, int rank, int size) {
  if (rc != MPI_SUCCESS)
    FORGE_THROW("MPI: ", op, " on rank ", rank, " of ", size, " failed: ", mpi_error_string(rc));
}

// The MPI datatype a tensor travels as. 16-bit floats move as 2-byte integers; they are never
// reduced as such (reductions go through f32 buffers).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    default: FORGE_THROW("MPI: dtype ", dtype_name(t), " has no MPI datatype");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  FORGE_THROW("MPI: unknown ReduceOp");
}

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

// The dtype a reduction runs in: f32 for 16-bit floats, the tensor's own otherwise.
DType reduce_dtype(DType t) { return is_16bit(t) ? DType::f32 : t; }

char* bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Calls f(first, count) for consecutive chunks of at most max_count() elements of [0, n).
// Nothing for n == 0 (every rank has the same n, so every rank skips the call).
template <class F> void for_chunks(int64_t n, F&& f) {
  const int64_t m = max_count();
  for (int64_t c0 = 0; c0 < n; c0 += m) f(c0, static_cast<int>(std::min(m, n - c0)));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = bytes(a);
  const char* b0 = bytes(b);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes() && a.nbytes() > 0 && b.nbytes() > 0;
}

// avg's division by W, in place, on an f32 or f64 tensor (16-bit tensors are reduced in f32).
void divide_by(const Tensor& t, int w) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    const float d = static_cast<float>(w);
#pragma omp parallel for if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    const double d = static_cast<double>(w);
#pragma omp parallel for if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else {
    FORGE_THROW("MPI: avg on ", dtype_name(t.dtype()));
  }
}

// dst <- src (converting the dtype), outside autograd.
// `src` may be a flat buffer of dst's elements (the f32 buffer of a 16-bit reduction).
void copy_into(const Tensor& dst, const Tensor& src) {
  NoGradGuard ng;
  Tensor d = dst.detach();
  ops::copy_(d, src.shape() == dst.shape() ? src.detach() : src.detach().reshape(dst.shape()));
}

Tensor converted(const Tensor& t, DType dtype) {
  NoGradGuard ng;
  return ops::to(t.detach(), dtype);
}

// A datatype of `count` contiguous elements of `base` whose extent is `stride_elems`
// elements: item r of a buffer of these starts at r * stride_elems, so chunk [c0, c0 + count)
// of every rank's slice of a [W, n] buffer is one item per rank. Freed by the destructor:
// MPI keeps a datatype alive for the operations already started with it.
class StridedChunkType {
 public:
  StridedChunkType(MPI_Datatype base, int count, int64_t stride_elems) {
    int size = 0;
    check_mpi(MPI_Type_size(base, &size), "MPI_Type_size");
    MPI_Datatype contig;
    check_mpi(MPI_Type_contiguous(count, base, &contig), "MPI_Type_contiguous");
    const int rc = MPI_Type_create_resized(contig, 0, static_cast<MPI_Aint>(stride_elems) * size, &type_);
    MPI_Type_free(&contig);
    check_mpi(rc, "MPI_Type_create_resized");
    check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
  }
  ~StridedChunkType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  StridedChunkType(const StridedChunkType&) = delete;
  StridedChunkType& operator=(const StridedChunkType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// One communicator, freed with the last group or Work that uses it (never after MPI_Finalize).
struct Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit Comm(MPI_Comm c) : comm(c) {}
  ~Comm() {
    if (comm != MPI_COMM_NULL && active()) MPI_Comm_free(&comm);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
};

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Comm> comm, const char* op, int rank, int size)
      : comm_(std::move(comm)), op_(op), rank_(rank), size_(size) {}

  ~MpiWork() override {
    // Never leave MPI writing into memory that is about to be freed: a Work dropped without
    // wait() completes here (its host-side finish step is skipped).
    if (!done_ && !requests_.empty() && active()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  void wait() override { complete(/*block=*/true); }
  void synchronize() override { complete(/*block=*/true); }
  bool is_completed() override { return complete(/*block=*/false); }

  // Starting the operation.
  MPI_Request* new_request() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  void keep(const Tensor& t) {
    if (t.defined()) kept_.push_back(t);
  }
  void on_complete(std::function<void()> f) { finish_ = std::move(f); }
  void check(int rc) const { check_op(rc, op_, rank_, size_); }
  MPI_Comm comm() const { return comm_->comm; }

 private:
  bool complete(bool block) {
    if (done_) return true;
    if (!requests_.empty()) {
      std::vector<MPI_Status> statuses(requests_.size());
      const int n = static_cast<int>(requests_.size());
      int rc;
      if (block) {
        rc = wait_all_or_abort(n, statuses);
      } else {
        int flag = 0;
        rc = MPI_Testall(n, requests_.data(), &flag, statuses.data());
        if (rc == MPI_SUCCESS && !flag) return false;
      }
      if (rc == MPI_ERR_IN_STATUS) {
        for (const MPI_Status& s : statuses)
          if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) rc = s.MPI_ERROR;
      }
      if (rc != MPI_SUCCESS) {
        done_ = true;  // the requests are gone either way
        check(rc);
      }
    }
    done_ = true;
    if (finish_) {
      auto f = std::move(finish_);
      finish_ = nullptr;
      f();
    }
    kept_.clear();
    return true;
  }

  // Note [MPI timeout]. MPI has no timeout of its own: a peer that is stuck, or unreachable
  // without its process dying (which mpirun would notice), would leave this rank waiting
  // forever. So a blocking wait polls (MPI_Testall: spinning for the first millisecond, then
  // every 100 us) and, after FORGE_DIST_TIMEOUT seconds (default 300), prints which operation
  // did not complete and calls MPI_Abort, which ends every rank of the job (throwing would
  // not: this rank's pending collective could never be cancelled or finalised).
  int wait_all_or_abort(int n, std::vector<MPI_Status>& statuses) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const double limit = mpi_timeout_seconds();
    for (int polls = 0;; ++polls) {
      int flag = 0;
      const int rc = MPI_Testall(n, requests_.data(), &flag, statuses.data());
      if (rc != MPI_SUCCESS || flag) return rc;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > limit) {
        std::fprintf(stderr,
                     "forge: error: MPI %s on rank %d of %d did not complete within %.0f s (FORGE_DIST_TIMEOUT): a "
                     "peer is stuck, dead or unreachable, or did not make the same collective call; aborting the "
                     "job\n",
                     op_, rank_, size_, limit);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  std::shared_ptr<Comm> comm_;
  const char* op_;
  int rank_, size_;
  // new_request()'s pointer is handed to the MPI call at once, before the next push_back.
  std::vector<MPI_Request> requests_;
  std::vector<Tensor> kept_;
  std::function<void()> finish_;
  bool done_ = false;
};

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(std::shared_ptr<Comm> comm, int rank, int size) : ProcessGroup(rank, size), comm_(std::move(comm)) {}

  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    detail::check_tensor(*this, "all_reduce", "t", t);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    auto w = start("all_reduce");
    const Tensor buf = is_16bit(t.dtype()) ? converted(t, DType::f32) : t;
    w->keep(t);
    w->keep(buf);
    const MPI_Datatype type = mpi_type(buf.dtype());
    const size_t es = buf.element_size();
    for_chunks(buf.numel(), [&](int64_t c0, int k) {
      w->check(MPI_Iallreduce(MPI_IN_PLACE, bytes(buf) + c0 * es, k, type, mpi_op(op), w->comm(), w->new_request()));
    });
    w->on_complete(finisher(t, buf, op));
    return w;
  }

  WorkPtr reduce(const Tensor& t, int root, ReduceOp op) override {
    detail::check_rank(*this, "reduce", "root", root);
    detail::check_tensor(*this, "reduce", "t", t);
    detail::check_reduce_op("reduce", op, t.dtype());
    auto w = start("reduce");
    const Tensor buf = is_16bit(t.dtype()) ? converted(t, DType::f32) : t;
    w->keep(t);
    w->keep(buf);
    const MPI_Datatype type = mpi_type(buf.dtype());
    const size_t es = buf.element_size();
    const bool is_root = rank() == root;
    for_chunks(buf.numel(), [&](int64_t c0, int k) {
      char* p = bytes(buf) + c0 * es;
      w->check(MPI_Ireduce(is_root ? MPI_IN_PLACE : p, is_root ? p : nullptr, k, type, mpi_op(op), root, w->comm(),
                           w->new_request()));
    });
    if (is_root) w->on_complete(finisher(t, buf, op));
    return w;
  }

  WorkPtr broadcast(const Tensor& t, int root) override {
    detail::check_rank(*this, "broadcast", "root", root);
    detail::check_tensor(*this, "broadcast", "t", t);
    auto w = start("broadcast");
    w->keep(t);
    const MPI_Datatype type = mpi_type(t.dtype());
    const size_t es = t.element_size();
    for_chunks(t.numel(), [&](int64_t c0, int k) {
      w->check(MPI_Ibcast(bytes(t) + c0 * es, k, type, root, w->comm(), w->new_request()));
    });
    return w;
  }

  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    detail::check_all_gather(*this, output, input);
    const int64_t n = input.numel();
    const bool in_place = own_slot(output, input, rank(), n, "all_gather");
    auto w = start("all_gather");
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = mpi_type(input.dtype());
    const size_t es = input.element_size();
    if (n <= max_count()) {
      if (n > 0)
        w->check(MPI_Iallgather(in_place ? MPI_IN_PLACE : bytes(input), static_cast<int>(n), type, bytes(output),
                                static_cast<int>(n), type, w->comm(), w->new_request()));
      return w;
    }
    for_chunks(n, [&](int64_t c0, int k) {
      StridedChunkType chunk(type, k, n);
      w->check(MPI_Iallgather(in_place ? MPI_IN_PLACE : bytes(input) + c0 * es, k, type, bytes(output) + c0 * es, 1,
                              chunk.get(), w->comm(), w->new_request()));
    });
    return w;
  }

  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_reduce_scatter(*this, output, input, op);
    const int64_t n = output.numel();
    const DType rd = reduce_dtype(input.dtype());
    auto w = start("reduce_scatter");
    w->keep(output);
    w->keep(input);
    const Tensor src = rd != input.dtype() ? converted(input, rd) : input;
    const Tensor dst = rd != output.dtype() || overlaps(output, input) ? forge::empty({n}, {.dtype = rd}) : output;
    w->keep(src);
    w->keep(dst);
    const MPI_Datatype type = mpi_type(rd);
    const size_t es = element_size(rd);
    if (n <= max_count()) {
      if (n > 0)
        w->check(MPI_Ireduce_scatter_block(bytes(src), bytes(dst), static_cast<int>(n), type, mpi_op(op), w->comm(),
                                           w->new_request()));
    } else {
      // Chunk [c0, c0 + k) of every rank's slice, packed into one [W, k] buffer per call.
      for_chunks(n, [&](int64_t c0, int k) {
        Tensor pack = forge::empty({static_cast<int64_t>(size()) * k}, {.dtype = rd});
        for (int r = 0; r < size(); ++r)
          std::memcpy(bytes(pack) + static_cast<size_t>(r) * k * es, bytes(src) + (r * n + c0) * es, k * es);
        w->keep(pack);
        w->check(MPI_Ireduce_scatter_block(bytes(pack), bytes(dst) + c0 * es, k, type, mpi_op(op), w->comm(),
                                           w->new_request()));
      });
    }
    w->on_complete(finisher(output, dst, op));
    return w;
  }

  WorkPtr gather(const Tensor& output, const Tensor& input, int root) override {
    detail::check_gather(*this, output, input, root);
    const int64_t n = input.numel();
    const bool is_root = rank() == root;
    const bool in_place = is_root && own_slot(output, input, rank(), n, "gather");
    auto w = start("gather");
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = mpi_type(input.dtype());
    const size_t es = input.element_size();
    if (n <= max_count()) {
      if (n > 0)
        w->check(MPI_Igather(in_place ? MPI_IN_PLACE : bytes(input), static_cast<int>(n), type,
                             is_root ? bytes(output) : nullptr, is_root ? static_cast<int>(n) : 0, type, root,
                             w->comm(), w->new_request()));
      return w;
    }
    for_chunks(n, [&](int64_t c0, int k) {
      if (is_root) {
        StridedChunkType chunk(type, k, n);
        w->check(MPI_Igather(in_place ? MPI_IN_PLACE : bytes(input) + c0 * es, k, type, bytes(output) + c0 * es, 1,
                             chunk.get(), root, w->comm(), w->new_request()));
      } else {
        w->check(MPI_Igather(bytes(input) + c0 * es, k, type, nullptr, 0, type, root, w->comm(), w->new_request()));
      }
    });
    return w;
  }

  WorkPtr scatter(const Tensor& output, const Tensor& input, int root) override {
    detail::check_scatter(*this, output, input, root);
    const int64_t n = output.numel();
    const bool is_root = rank() == root;
    const bool in_place = is_root && own_slot(input, output, rank(), n, "scatter");
    auto w = start("scatter");
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = mpi_type(output.dtype());
    const size_t es = output.element_size();
    if (n <= max_count()) {
      if (n > 0)
        w->check(MPI_Iscatter(is_root ? bytes(input) : nullptr, is_root ? static_cast<int>(n) : 0, type,
                              in_place ? MPI_IN_PLACE : bytes(output), static_cast<int>(n), type, root, w->comm(),
                              w->new_request()));
      return w;
    }
    for_chunks(n, [&](int64_t c0, int k) {
      char* out = in_place ? static_cast<char*>(MPI_IN_PLACE) : bytes(output) + c0 * es;
      if (is_root) {
        StridedChunkType chunk(type, k, n);
        w->check(MPI_Iscatter(bytes(input) + c0 * es, 1, chunk.get(), out, k, type, root, w->comm(),
                              w->new_request()));
      } else {
        w->check(MPI_Iscatter(nullptr, 0, type, out, k, type, root, w->comm(), w->new_request()));
      }
    });
    return w;
  }

  WorkPtr all_to_all(const Tensor& output, const Tensor& input) override {
    detail::check_all_to_all(*this, output, input);
    const int64_t n = input.numel() / size();  // elements per block
    auto w = start("all_to_all");
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = mpi_type(input.dtype());
    const size_t es = input.element_size();
    if (n <= max_count()) {
      if (n > 0)
        w->check(MPI_Ialltoall(bytes(input), static_cast<int>(n), type, bytes(output), static_cast<int>(n), type,
                               w->comm(), w->new_request()));
      return w;
    }
    // Chunk [c0, c0 + k) of every block at once: one element of a type of k elements whose extent is a block.
    for_chunks(n, [&](int64_t c0, int k) {
      StridedChunkType chunk(type, k, n);
      w->check(MPI_Ialltoall(bytes(input) + c0 * es, 1, chunk.get(), bytes(output) + c0 * es, 1, chunk.get(),
                             w->comm(), w->new_request()));
    });
    return w;
  }

  WorkPtr send(const Tensor& t, int dst, int tag) override { return point_to_point("send", "dst", t, dst, tag); }
  WorkPtr recv(const Tensor& t, int src, int tag) override { return point_to_point("recv", "src", t, src, tag); }

  // send (op "send") or recv of t to / from `peer`. Messages of one (source, tag, communicator)
  // arrive in order, so the chunks match.
  WorkPtr point_to_point(const char* op, const char* peer_name, const Tensor& t, int peer, int tag) {
    detail::check_peer(*this, op, peer_name, peer);
    detail::check_tensor(*this, op, "t", t);
    check_tag(op, tag);
    const bool sending = std::strcmp(op, "send") == 0;
    auto w = start(op);
    w->keep(t);
    const MPI_Datatype type = mpi_type(t.dtype());
    const size_t es = t.element_size();
    for_chunks(t.numel(), [&](int64_t c0, int k) {
      w->check(sending ? MPI_Isend(bytes(t) + c0 * es, k, type, peer, tag, w->comm(), w->new_request())
                       : MPI_Irecv(bytes(t) + c0 * es, k, type, peer, tag, w->comm(), w->new_request()));
    });
    return w;
  }

  WorkPtr barrier() override {
    auto w = start("barrier");
    w->check(MPI_Ibarrier(w->comm(), w->new_request()));
    return w;
  }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    const std::vector<int> members = detail::check_group_ranks(*this, ranks);
    const auto it = std::find(members.begin(), members.end(), rank());
    const bool member = it != members.end();
    MPI_Comm sub = MPI_COMM_NULL;
    check_op(MPI_Comm_split(comm_->comm, member ? 0 : MPI_UNDEFINED, member ? static_cast<int>(it - members.begin()) : 0,
                            &sub),
             "new_group (MPI_Comm_split)", rank(), size());
    if (!member) return nullptr;
    auto comm = std::make_shared<Comm>(sub);
    check_mpi(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    int r = 0, s = 0;
    check_mpi(MPI_Comm_rank(sub, &r), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(sub, &s), "MPI_Comm_size");
    return std::make_shared<MpiGroup>(std::move(comm), r, s);
  }

 private:
  std::shared_ptr<MpiWork> start(const char* op) {
    FORGE_CHECK(active(), op, ": MPI is not active (parallel::shutdown() has run); the group can no longer be used");
    return std::make_shared<MpiWork>(comm_, op, rank(), size());
  }

  // Whether `part` is exactly slice `r` (of `n` elements) of `whole`: then MPI_IN_PLACE. Any
  // other overlap would make MPI read and write the same memory: refused.
  static bool own_slot(const Tensor& whole, const Tensor& part, int r, int64_t n, const char* op) {
    if (!overlaps(whole, part)) return false;
    FORGE_CHECK(bytes(part) == bytes(whole) + static_cast<size_t>(r) * n * part.element_size(), op,
                ": the single-rank tensor overlaps the ", op == std::string("scatter") ? "input" : "output",
                " other than at this rank's slice [", r * n, ", ", (r + 1) * n,
                "); pass that exact slice (in place) or separate memory");
    return true;
  }

  static void check_tag(const char* op, int tag) {
    FORGE_CHECK(tag >= 0 && tag <= 32767, op, ": tag ", tag, " is outside [0, 32767] (the range every MPI allows)");
  }

  // After a reduction into `buf`: avg's division, then the result copied into `t` when the
  // reduction ran in a buffer of its own (16-bit tensors, overlapping reduce_scatter).
  std::function<void()> finisher(const Tensor& t, const Tensor& buf, ReduceOp op) {
    const int w = size();
    return [t, buf, op, w] {
      if (op == ReduceOp::avg) divide_by(buf, w);
      if (!buf.is_same(t)) copy_into(t, buf);
    };
  }

  std::shared_ptr<Comm> comm_;
};

}  // namespace

void init() {
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  if (initialised) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  g_initialised_here = true;
  FORGE_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI: this MPI library gives thread level ", provided,
              " but forge needs MPI_THREAD_FUNNELED");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void finalize() {
  if (g_initialised_here && active()) MPI_Finalize();
  g_initialised_here = false;
}

bool active() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return false;
  MPI_Finalized(&finalised);
  return !finalised;
}

int world_rank() {
  int r = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &r), "MPI_Comm_rank");
  return r;
}

int world_size() {
  int s = 0;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &s), "MPI_Comm_size");
  return s;
}

void broadcast_bytes(void* data, int bytes, int root) {
  check_mpi(MPI_Bcast(data, bytes, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
}

ProcessGroupPtr make_world_group() {
  FORGE_CHECK(active(), "MPI: make_world_group needs an initialised MPI (parallel::init_world does it)");
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  auto comm = std::make_shared<Comm>(dup);
  check_mpi(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int r = 0, s = 0;
  check_mpi(MPI_Comm_rank(dup, &r), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(dup, &s), "MPI_Comm_size");
  return std::make_shared<MpiGroup>(std::move(comm), r, s);
}

int64_t max_count() { return env::integer("FORGE_MPI_MAX_COUNT"); }

}  // namespace forge::parallel::mpi
