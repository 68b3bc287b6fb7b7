// forge::parallel::ProcessGroup on MPI, run under `mpirun -np 1|2|4 forge_parallel_tests` (main.cpp).
//
// Every rank runs every test and makes the same sequence of collective calls: checks never
// change control flow (EXPECT_*, no early returns between collectives). Inputs are random,
// seeded by (test, rank), never zero, and every rank can recompute every other rank's input,
// so expected results are computed locally. Values are multiples of 1/8 of magnitude at most
// 4 (integers for integer dtypes): every sum, max, min and avg over up to 4 ranks is exact in
// every dtype, bf16 and f16 included, so results are compared exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "forge/core/env.h"
#include "forge/ops/creation.h"
#include "forge/parallel/mpi_group.h"
#include "forge/parallel/process_group.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

ProcessGroup& W() { return *world(); }

// Rank `rank`'s reproducible input of test `seed`: n values, never zero.
std::vector<double> values(uint64_t seed, int rank, int64_t n, DType dtype) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ull;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    s ^= s >> 31;
    s *= 0x94D049BB133111EBull;
    s ^= s >> 29;
    s += 0x9E3779B97F4A7C15ull;
    const int k = static_cast<int>((s >> 33) % 32) + 1;  // 1..32
    if (dtype == DType::u8) {
      x = k + ((s >> 20) % 28);  // 1..59: a sum over 4 ranks fits in u8
    } else if (is_floating(dtype)) {
      x = ((s >> 17) & 1 ? 1.0 : -1.0) * k / 8.0;  // ±[1/8, 4] in steps of 1/8
    } else {
      x = ((s >> 17) & 1 ? 1.0 : -1.0) * (k + static_cast<int>((s >> 40) % 1000));
    }
  }
  return v;
}

Tensor make(const std::vector<double>& v, DType dtype) {
  return from_vector(v, {static_cast<int64_t>(v.size())}, {.dtype = dtype});
}

std::vector<double> read(const Tensor& t) { return t.to_vector<double>(); }

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum: case ReduceOp::avg: return a + b;
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
  }
  return 0;
}

// op over every rank's values(seed, r, n) (avg divided by the group size).
std::vector<double> reduced(ReduceOp op, uint64_t seed, int64_t n, DType dtype, int world) {
  std::vector<double> acc = values(seed, 0, n, dtype);
  for (int r = 1; r < world; ++r) {
    const auto v = values(seed, r, n, dtype);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(op, acc[i], v[i]);
  }
  if (op == ReduceOp::avg)
    for (auto& x : acc) x /= world;
  return acc;
}

std::string label(DType dt, ReduceOp op) { return std::string(dtype_name(dt)) + " " + reduce_op_name(op); }

const DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64, DType::i32, DType::u8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

bool valid(ReduceOp op, DType dt) { return op != ReduceOp::avg || is_floating(dt); }

// ---- the checks, each over every dtype (and op); n elements per rank ---------------------

void check_all_reduce(int64_t n) {
  uint64_t seed = 100;
  for (DType dt : kDTypes)
    for (ReduceOp op : kOps) {
      if (!valid(op, dt)) continue;
      ++seed;
      Tensor t = make(values(seed, W().rank(), n, dt), dt);
      W().all_reduce(t, op)->wait();
      EXPECT_EQ(read(t), reduced(op, seed, n, dt, W().size())) << "all_reduce " << label(dt, op) << " n=" << n;
    }
}

void check_reduce(int64_t n) {
  uint64_t seed = 200;
  for (int root : {0, W().size() - 1})
    for (DType dt : kDTypes)
      for (ReduceOp op : kOps) {
        if (!valid(op, dt)) continue;
        ++seed;
        const auto mine = values(seed, W().rank(), n, dt);
        Tensor t = make(mine, dt);
        W().reduce(t, root, op)->wait();
        if (W().rank() == root)
          EXPECT_EQ(read(t), reduced(op, seed, n, dt, W().size())) << "reduce root " << root << " " << label(dt, op);
        else
          EXPECT_EQ(read(t), mine) << "reduce changed a non-root tensor, " << label(dt, op);
      }
}

void check_broadcast(int64_t n) {
  uint64_t seed = 300;
  for (int root = 0; root < W().size(); ++root)
    for (DType dt : kDTypes) {
      ++seed;
      Tensor t = make(values(seed, W().rank(), n, dt), dt);
      W().broadcast(t, root)->wait();
      EXPECT_EQ(read(t), values(seed, root, n, dt)) << "broadcast root " << root << " " << dtype_name(dt);
    }
}

std::vector<double> concatenated(uint64_t seed, int64_t n, DType dt, int world) {
  std::vector<double> all;
  for (int r = 0; r < world; ++r) {
    const auto v = values(seed, r, n, dt);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

void check_all_gather(int64_t n) {
  uint64_t seed = 400;
  const int w = W().size(), r = W().rank();
  for (DType dt : kDTypes) {
    ++seed;
    Tensor in = make(values(seed, r, n, dt), dt);
    Tensor out = full({w, n}, -7.0, {.dtype = dt});  // any shape with W * n elements
    W().all_gather(out, in)->wait();
    EXPECT_EQ(read(out), concatenated(seed, n, dt, w)) << "all_gather " << dtype_name(dt) << " n=" << n;
    EXPECT_EQ(read(in), values(seed, r, n, dt)) << "all_gather changed its input";

    // In place: the input is this rank's slice of the output.
    ++seed;
    Tensor flat = full({w * n}, -7.0, {.dtype = dt});
    Tensor slice = flat.narrow(0, r * n, n);
    slice.copy_(make(values(seed, r, n, dt), dt));
    W().all_gather(flat, slice)->wait();
    EXPECT_EQ(read(flat), concatenated(seed, n, dt, w)) << "in-place all_gather " << dtype_name(dt);
  }
}

void check_reduce_scatter(int64_t n) {
  uint64_t seed = 500;
  const int w = W().size(), r = W().rank();
  for (DType dt : kDTypes)
    for (ReduceOp op : kOps) {
      if (!valid(op, dt)) continue;
      ++seed;
      const auto full_result = reduced(op, seed, w * n, dt, w);
      const std::vector<double> expect(full_result.begin() + r * n, full_result.begin() + (r + 1) * n);
      Tensor in = make(values(seed, r, w * n, dt), dt);
      Tensor out = full({n}, -7.0, {.dtype = dt});
      W().reduce_scatter(out, in, op)->wait();
      EXPECT_EQ(read(out), expect) << "reduce_scatter " << label(dt, op) << " n=" << n;
      EXPECT_EQ(read(in), values(seed, r, w * n, dt)) << "reduce_scatter changed its input";

      // The output is this rank's slice of the input (ZeRO's layout).
      Tensor in2 = make(values(seed, r, w * n, dt), dt);
      Tensor slice = in2.narrow(0, r * n, n);
      W().reduce_scatter(slice, in2, op)->wait();
      EXPECT_EQ(read(slice), expect) << "in-place reduce_scatter " << label(dt, op);

      // A multi-dimensional output (sequence parallelism's (B, T / W, C) slices): 16-bit tensors
      // reduce in an f32 buffer of their own, which lands in the output's shape.
      Tensor out2 = full({n, 1}, -7.0, {.dtype = dt});
      W().reduce_scatter(out2, make(values(seed, r, w * n, dt), dt), op)->wait();
      EXPECT_EQ(read(out2.reshape({n})), expect) << "reduce_scatter into a 2-D output " << label(dt, op);
    }
}

void check_gather(int64_t n) {
  uint64_t seed = 600;
  const int w = W().size(), r = W().rank();
  for (int root = 0; root < w; ++root)
    for (DType dt : kDTypes) {
      ++seed;
      Tensor in = make(values(seed, r, n, dt), dt);
      Tensor out = r == root ? full({w * n}, -7.0, {.dtype = dt}) : Tensor();  // undefined off root
      W().gather(out, in, root)->wait();
      if (r == root) {
        EXPECT_EQ(read(out), concatenated(seed, n, dt, w)) << "gather root " << root << " " << dtype_name(dt);
      }
      // In place on root.
      ++seed;
      Tensor flat = full({w * n}, -7.0, {.dtype = dt});
      Tensor slice = flat.narrow(0, r * n, n);
      slice.copy_(make(values(seed, r, n, dt), dt));
      W().gather(flat, slice, root)->wait();
      if (r == root) {
        EXPECT_EQ(read(flat), concatenated(seed, n, dt, w)) << "in-place gather " << dtype_name(dt);
      }
    }
}

void check_scatter(int64_t n) {
  uint64_t seed = 700;
  const int w = W().size(), r = W().rank();
  for (int root = 0; root < w; ++root)
    for (DType dt : kDTypes) {
      ++seed;
      const auto src = values(seed, root, w * n, dt);  // root's input
      const std::vector<double> expect(src.begin() + r * n, src.begin() + (r + 1) * n);
      Tensor in = r == root ? make(src, dt) : Tensor();  // undefined off root
      Tensor out = full({n}, -7.0, {.dtype = dt});
      W().scatter(out, in, root)->wait();
      EXPECT_EQ(read(out), expect) << "scatter root " << root << " " << dtype_name(dt);
      // In place on root: root's output is its slice of the input.
      Tensor in2 = r == root ? make(src, dt) : Tensor();
      Tensor out2 = r == root ? in2.narrow(0, r * n, n) : full({n}, -7.0, {.dtype = dt});
      W().scatter(out2, in2, root)->wait();
      EXPECT_EQ(read(out2), expect) << "in-place scatter root " << root << " " << dtype_name(dt);
    }
}

// Rank r's input is w blocks of n; block j goes to rank j, which keeps it at block r.
void check_all_to_all(int64_t n) {
  uint64_t seed = 750;
  const int w = W().size(), r = W().rank();
  for (DType dt : kDTypes) {
    ++seed;
    std::vector<double> expect;
    for (int src = 0; src < w; ++src) {
      const auto v = values(seed, src, w * n, dt);
      expect.insert(expect.end(), v.begin() + r * n, v.begin() + (r + 1) * n);
    }
    Tensor in = make(values(seed, r, w * n, dt), dt);
    Tensor out = full({w * n}, -7.0, {.dtype = dt});
    W().all_to_all(out, in)->wait();
    EXPECT_EQ(read(out), expect) << "all_to_all " << dtype_name(dt) << " n=" << n;
    EXPECT_EQ(read(in), values(seed, r, w * n, dt)) << "all_to_all changed its input";
  }
}

void check_send_recv(int64_t n) {
  const int w = W().size(), r = W().rank();
  if (w == 1) return;  // every rank skips: no collective is involved
  uint64_t seed = 800;
  for (DType dt : kDTypes) {
    ++seed;
    // A ring, both directions posted before either is waited on; two tags in flight at once.
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    Tensor a = make(values(seed, r, n, dt), dt), b = make(values(seed + 1000, r, n, dt), dt);
    Tensor ra = full({n}, -7.0, {.dtype = dt}), rb = full({n}, -7.0, {.dtype = dt});
    auto s1 = W().send(a, next, 1);
    auto s2 = W().send(b, next, 2);
    auto r2 = W().recv(rb, prev, 2);
    auto r1 = W().recv(ra, prev, 1);
    r1->wait();
    r2->wait();
    s1->wait();
    s2->wait();
    EXPECT_EQ(read(ra), values(seed, prev, n, dt)) << "recv tag 1 " << dtype_name(dt);
    EXPECT_EQ(read(rb), values(seed + 1000, prev, n, dt)) << "recv tag 2 " << dtype_name(dt);
  }
}

void check_everything(int64_t n) {
  check_all_reduce(n);
  check_reduce(n);
  check_broadcast(n);
  check_all_gather(n);
  check_reduce_scatter(n);
  check_gather(n);
  check_scatter(n);
  check_all_to_all(n);
  check_send_recv(n);
}

// ---- tests ---------------------------------------------------------------------------------

TEST(MpiGroup, World) {
  ASSERT_NE(world(), nullptr);
  EXPECT_EQ(W().backend(), "mpi");
  EXPECT_EQ(W().device(), Device::cpu());
  EXPECT_GE(W().size(), 1);
  EXPECT_TRUE(W().rank() >= 0 && W().rank() < W().size());
  EXPECT_TRUE(have_mpi());
}

TEST(MpiGroup, AllReduce) { check_all_reduce(1037); }
TEST(MpiGroup, Reduce) { check_reduce(517); }
TEST(MpiGroup, Broadcast) { check_broadcast(333); }
TEST(MpiGroup, AllGather) { check_all_gather(129); }
TEST(MpiGroup, ReduceScatter) { check_reduce_scatter(257); }
TEST(MpiGroup, Gather) { check_gather(65); }
TEST(MpiGroup, Scatter) { check_scatter(77); }
TEST(MpiGroup, AllToAll) { check_all_to_all(91); }
TEST(MpiGroup, SendRecv) { check_send_recv(1001); }

TEST(MpiGroup, OneElementAndEmpty) {
  check_everything(1);
  check_everything(0);
}

TEST(MpiGroup, Barrier) {
  for (int i = 0; i < 3; ++i) W().barrier()->wait();
  auto b = W().barrier();
  b->synchronize();
  EXPECT_TRUE(b->is_completed());
}

// Every call at once, waited on in reverse order; is_completed() polls one of them.
TEST(MpiGroup, AsyncOverlap) {
  const int w = W().size(), r = W().rank();
  const int64_t n = 4099;
  Tensor a = make(values(900, r, n, DType::f32), DType::f32);
  Tensor b_in = make(values(901, r, n, DType::bf16), DType::bf16);
  Tensor b_out = empty({w * n}, {.dtype = DType::bf16});
  Tensor c = make(values(902, r, n, DType::f64), DType::f64);
  auto wa = W().all_reduce(a, ReduceOp::avg);
  auto wb = W().all_gather(b_out, b_in);
  auto wc = W().broadcast(c, w - 1);
  while (!wc->is_completed()) {
  }
  EXPECT_TRUE(wc->is_completed());
  wb->wait();
  wa->wait();
  wa->wait();  // a second wait is a no-op
  EXPECT_TRUE(wa->is_completed());
  EXPECT_EQ(read(a), reduced(ReduceOp::avg, 900, n, DType::f32, w));
  EXPECT_EQ(read(b_out), concatenated(901, n, DType::bf16, w));
  EXPECT_EQ(read(c), values(902, w - 1, n, DType::f64));
}

// A Work dropped without wait() completes in its destructor: the tensors stay valid.
TEST(MpiGroup, DroppedWorkCompletes) {
  const int r = W().rank();
  Tensor t = make(values(950, r, 100, DType::f64), DType::f64);
  W().all_reduce(t, ReduceOp::sum);  // Work discarded at once
  EXPECT_EQ(read(t), reduced(ReduceOp::sum, 950, 100, DType::f64, W().size()));
}

TEST(MpiGroup, SubGroups) {
  const int w = W().size(), r = W().rank();
  std::vector<int> even, odd;
  for (int i = 0; i < w; ++i) (i % 2 == 0 ? even : odd).push_back(i);
  auto ge = W().new_group(even);
  auto go = w > 1 ? W().new_group(odd) : nullptr;
  const bool is_even = r % 2 == 0;
  EXPECT_EQ(ge != nullptr, is_even);
  EXPECT_EQ(go != nullptr, !is_even);
  ProcessGroupPtr mine = is_even ? ge : go;
  const std::vector<int>& members = is_even ? even : odd;
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
  EXPECT_EQ(mine->rank(), r / 2);
  EXPECT_EQ(mine->backend(), "mpi");

  // all_reduce over the members: the expected value sums the members' inputs (world ranks).
  const int64_t n = 301;
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    Tensor t = make(values(1000, r, n, dt), dt);
    mine->all_reduce(t, ReduceOp::sum)->wait();
    std::vector<double> expect(n, 0.0);
    for (int m : members) {
      const auto v = values(1000, m, n, dt);
      for (int64_t i = 0; i < n; ++i) expect[i] += v[i];
    }
    EXPECT_EQ(read(t), expect) << "sub-group all_reduce " << dtype_name(dt);
    // broadcast from the sub-group's last rank and a world all_reduce interleaved.
    Tensor b = make(values(1001, r, n, dt), dt);
    auto wb = mine->broadcast(b, mine->size() - 1);
    Tensor x = make(values(1002, r, n, DType::f64), DType::f64);
    W().all_reduce(x, ReduceOp::max)->wait();
    wb->wait();
    EXPECT_EQ(read(b), values(1001, members.back(), n, dt));
    EXPECT_EQ(read(x), reduced(ReduceOp::max, 1002, n, DType::f64, w));
  }

  // A group of one carved from the sub-group, and the sub-group's own sub-group.
  auto first = mine->new_group({0});
  EXPECT_EQ(first != nullptr, mine->rank() == 0);
  if (first) {
    Tensor t = make(values(1003, r, 10, DType::f32), DType::f32);
    first->all_reduce(t, ReduceOp::avg)->wait();
    EXPECT_EQ(read(t), values(1003, r, 10, DType::f32));
    EXPECT_EQ(first->size(), 1);
  }
}

TEST(MpiGroup, ArgumentErrorsBeforeCommunication) {
  const int w = W().size();
  Tensor a = make(values(1100, W().rank(), 12, DType::f32), DType::f32);
  auto throws_with = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no forge::Error containing '" << needle << "'";
  };
  throws_with([&] { W().all_gather(empty({w * 12 + 1}), a); }, "all_gather: output has");
  throws_with([&] { W().reduce_scatter(empty({5}), a); }, "reduce_scatter: input has");
  throws_with([&] { W().all_to_all(empty({13}), a); }, "all_to_all: output has");
  throws_with([&] { W().all_to_all(a, a); }, "overlap");
  if (w > 1) throws_with([&] { W().all_to_all(empty({w * 12 + 1}), empty({w * 12 + 1})); }, "not a multiple");
  throws_with([&] { W().all_reduce(a.reshape({3, 4}).transpose(0, 1)); }, "not contiguous");
  throws_with([&] { W().broadcast(a, w); }, "broadcast: root");
  throws_with([&] { W().reduce(a, -1); }, "reduce: root");
  throws_with([&] { W().gather(empty({w * 12}), a, w + 3); }, "gather: root");
  throws_with([&] { W().scatter(empty({12}), empty({w * 12}), w); }, "scatter: root");
  throws_with([&] { W().all_reduce(full({4}, 1.0, {.dtype = DType::i64}), ReduceOp::avg); }, "avg");
  throws_with([&] { W().all_gather(empty({w * 12}, {.dtype = DType::f64}), a); }, "dtypes differ");
  throws_with([&] { W().all_reduce(full({4}, 1.0, {.dtype = DType::boolean})); }, "cannot be communicated");
  throws_with([&] { W().send(a, W().rank()); }, "own rank");
  throws_with([&] { W().recv(a, w); }, "recv: src");
  throws_with([&] { W().new_group({}); }, "empty");
  throws_with([&] { W().new_group({0, 0}); }, "strictly increasing");
  throws_with([&] { W().new_group({w}); }, "not a rank");
  if (w > 1) throws_with([&] { W().send(a, (W().rank() + 1) % w, -1); }, "tag");
  // Nothing was started: the next collective matches on every rank.
  Tensor t = make(values(1101, W().rank(), 50, DType::f64), DType::f64);
  W().all_reduce(t, ReduceOp::sum)->wait();
  EXPECT_EQ(read(t), reduced(ReduceOp::sum, 1101, 50, DType::f64, w));
}

// Counts above FORGE_MPI_MAX_COUNT are split into several calls: a limit of 7 elements
// exercises every chunked path (n not a multiple of 7, in-place variants included). The switch
// is read once per process (core/env.h), so the test overrides it.
TEST(MpiGroup, ChunkedLargeMessages) {
  {
    env::Override limit("FORGE_MPI_MAX_COUNT", "7");
    EXPECT_EQ(mpi::max_count(), 7);
    check_everything(50);
    check_everything(7);
  }
  {
    env::Override limit("FORGE_MPI_MAX_COUNT", "1");
    check_all_gather(3);
    check_reduce_scatter(3);
    check_all_to_all(3);
  }
}

}  // namespace
}  // namespace forge::parallel
