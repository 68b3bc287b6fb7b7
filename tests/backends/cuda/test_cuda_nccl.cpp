// forge::parallel on NCCL (parallel/nccl_group.cpp): a world of one process on cuda:0
// (every operation, avg included, through init_world and directly), and, with two or more
// GPUs, a group of two ranks in one process (one thread per rank and GPU, as two processes
// would run them), sub-groups included.
//
// Inputs are random, seeded by (check, rank), never zero, multiples of 1/8 of magnitude at
// most 4 (integers for integer dtypes): sums, max, min and avg over two ranks are exact in
// every dtype, bf16 and f16 included, so results are compared exactly.
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/stream.h"
#include "forge/forge.h"
#include "forge/parallel/nccl_group.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

std::vector<double> values(uint64_t seed, int rank, int64_t n, DType dtype) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ull;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    s ^= s >> 31;
    s *= 0x94D049BB133111EBull;
    s ^= s >> 29;
    s += 0x9E3779B97F4A7C15ull;
    const int k = static_cast<int>((s >> 33) % 32) + 1;
    if (dtype == DType::u8) x = k + ((s >> 20) % 28);
    else if (is_floating(dtype)) x = ((s >> 17) & 1 ? 1.0 : -1.0) * k / 8.0;
    else x = ((s >> 17) & 1 ? 1.0 : -1.0) * (k + static_cast<int>((s >> 40) % 1000));
  }
  return v;
}

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum: case ReduceOp::avg: return a + b;
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
  }
  return 0;
}

std::vector<double> reduced(ReduceOp op, uint64_t seed, int64_t n, DType dt, int world) {
  std::vector<double> acc = values(seed, 0, n, dt);
  for (int r = 1; r < world; ++r) {
    const auto v = values(seed, r, n, dt);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(op, acc[i], v[i]);
  }
  if (op == ReduceOp::avg)
    for (auto& x : acc) x /= world;
  return acc;
}

std::vector<double> concatenated(uint64_t seed, int64_t n, DType dt, int world) {
  std::vector<double> all;
  for (int r = 0; r < world; ++r) {
    const auto v = values(seed, r, n, dt);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

const DType kDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::i32, DType::u8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::string label(DType dt, ReduceOp op) { return std::string(dtype_name(dt)) + " " + reduce_op_name(op); }

// Every operation of group `g` (on g.device()), as rank g.rank() of g.size(); every rank of
// the group runs this at the same time.
void check_group(ProcessGroup& g, int64_t n) {
  const Device dev = g.device();
  const int w = g.size(), r = g.rank();
  auto make = [&](const std::vector<double>& v, DType dt) {
    return from_vector(v, {static_cast<int64_t>(v.size())}, {.dtype = dt, .device = dev});
  };
  auto filled = [&](int64_t count, DType dt) { return full({count}, -7.0, {.dtype = dt, .device = dev}); };
  auto read = [](const Tensor& t) { return t.to_vector<double>(); };
  uint64_t seed = 0;

  for (DType dt : kDTypes)
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::avg && !is_floating(dt)) continue;
      ++seed;
      Tensor t = make(values(seed, r, n, dt), dt);
      g.all_reduce(t, op)->wait();
      EXPECT_EQ(read(t), reduced(op, seed, n, dt, w)) << "all_reduce " << label(dt, op) << " rank " << r;

      for (int root : {0, w - 1}) {
        ++seed;
        const auto mine = values(seed, r, n, dt);
        Tensor u = make(mine, dt);
        g.reduce(u, root, op)->wait();
        if (r == root) {
          EXPECT_EQ(read(u), reduced(op, seed, n, dt, w)) << "reduce " << label(dt, op) << " root " << root;
        }
      }

      ++seed;
      const auto all = reduced(op, seed, w * n, dt, w);
      const std::vector<double> mine(all.begin() + r * n, all.begin() + (r + 1) * n);
      Tensor in = make(values(seed, r, w * n, dt), dt);
      Tensor out = filled(n, dt);
      g.reduce_scatter(out, in, op)->wait();
      EXPECT_EQ(read(out), mine) << "reduce_scatter " << label(dt, op);
      Tensor in2 = make(values(seed, r, w * n, dt), dt);
      Tensor slot = in2.narrow(0, r * n, n);
      g.reduce_scatter(slot, in2, op)->wait();
      EXPECT_EQ(read(slot), mine) << "in-place reduce_scatter " << label(dt, op);
    }

  for (DType dt : kDTypes) {
    for (int root = 0; root < w; ++root) {
      ++seed;
      Tensor t = make(values(seed, r, n, dt), dt);
      g.broadcast(t, root)->wait();
      EXPECT_EQ(read(t), values(seed, root, n, dt)) << "broadcast " << dtype_name(dt) << " root " << root;

      ++seed;
      Tensor gin = make(values(seed, r, n, dt), dt);
      Tensor gout = r == root ? filled(w * n, dt) : Tensor();
      g.gather(gout, gin, root)->wait();
      if (r == root) {
        EXPECT_EQ(read(gout), concatenated(seed, n, dt, w)) << "gather " << dtype_name(dt) << " root " << root;
      }

      ++seed;
      const auto src = values(seed, root, w * n, dt);
      const std::vector<double> part(src.begin() + r * n, src.begin() + (r + 1) * n);
      Tensor sin = r == root ? make(src, dt) : Tensor();
      Tensor sout = filled(n, dt);
      g.scatter(sout, sin, root)->wait();
      EXPECT_EQ(read(sout), part) << "scatter " << dtype_name(dt) << " root " << root;
      // In place on root: its output is its own slice of the input.
      Tensor sin2 = r == root ? make(src, dt) : Tensor();
      Tensor sout2 = r == root ? sin2.narrow(0, r * n, n) : filled(n, dt);
      g.scatter(sout2, sin2, root)->wait();
      EXPECT_EQ(read(sout2), part) << "in-place scatter " << dtype_name(dt) << " root " << root;
    }

    ++seed;
    Tensor in = make(values(seed, r, n, dt), dt);
    Tensor out = full({w, n}, -7.0, {.dtype = dt, .device = dev});
    g.all_gather(out, in)->wait();
    EXPECT_EQ(read(out), concatenated(seed, n, dt, w)) << "all_gather " << dtype_name(dt);
    Tensor flat = filled(w * n, dt);
    Tensor slot = flat.narrow(0, r * n, n);
    slot.copy_(make(values(seed, r, n, dt), dt));
    g.all_gather(flat, slot)->wait();
    EXPECT_EQ(read(flat), concatenated(seed, n, dt, w)) << "in-place all_gather " << dtype_name(dt);

    ++seed;
    {  // all_to_all: block j of rank r's input lands at block r of rank j's output.
      std::vector<double> mine;
      for (int src = 0; src < w; ++src) {
        const auto v = values(seed, src, w * n, dt);
        mine.insert(mine.end(), v.begin() + r * n, v.begin() + (r + 1) * n);
      }
      Tensor ain = make(values(seed, r, w * n, dt), dt);
      Tensor aout = filled(w * n, dt);
      g.all_to_all(aout, ain)->wait();
      EXPECT_EQ(read(aout), mine) << "all_to_all " << dtype_name(dt);
      EXPECT_EQ(read(ain), values(seed, r, w * n, dt)) << "all_to_all changed its input";
    }

    if (w > 1) {
      // One stream per group runs sends and receives in call order: even ranks send first,
      // odd ranks receive first, so a ring never waits on itself.
      ++seed;
      const int next = (r + 1) % w, prev = (r + w - 1) % w;
      Tensor a = make(values(seed, r, n, dt), dt);
      Tensor b = filled(n, dt);
      WorkPtr s, v;
      if (r % 2 == 0) {
        s = g.send(a, next);
        v = g.recv(b, prev);
      } else {
        v = g.recv(b, prev);
        s = g.send(a, next);
      }
      v->wait();
      s->synchronize();
      EXPECT_EQ(read(b), values(seed, prev, n, dt)) << "send/recv " << dtype_name(dt);
    }
  }

  g.barrier()->wait();

  // Three operations in flight, waited on in reverse order; inputs made and results used on
  // a non-default current stream (the group's stream waits for it through an event).
  {
    cuda::Stream side = cuda::Stream::create(dev.index);
    cuda::StreamGuard sg(side);
    Tensor a = make(values(500, r, n, DType::f32), DType::f32) * 2.0;  // computed on `side`
    Tensor b = make(values(501, r, n, DType::bf16), DType::bf16);
    Tensor bo = empty({w * n}, {.dtype = DType::bf16, .device = dev});
    Tensor c = make(values(502, r, n, DType::f64), DType::f64);
    auto wa = g.all_reduce(a, ReduceOp::avg);
    auto wb = g.all_gather(bo, b);
    auto wc = g.broadcast(c, w - 1);
    wc->synchronize();
    EXPECT_TRUE(wc->is_completed());
    wb->wait();
    wa->wait();
    Tensor a2 = a * 0.5;  // runs on `side` after the all-reduce
    auto expect_a = reduced(ReduceOp::avg, 500, n, DType::f32, w);
    EXPECT_EQ(read(a2), expect_a);
    EXPECT_EQ(read(bo), concatenated(501, n, DType::bf16, w));
    EXPECT_EQ(read(c), values(502, w - 1, n, DType::f64));
  }

  // Bad arguments throw before anything starts (every rank passes the same ones).
  Tensor bad = filled(4, DType::f32);
  EXPECT_THROW(g.all_reduce(full({4}, 1.0)), Error);  // a CPU tensor
  EXPECT_THROW(g.all_gather(filled(w * 4 + 1, DType::f32), bad), Error);
  EXPECT_THROW(g.broadcast(bad, w), Error);
  EXPECT_THROW(g.all_to_all(bad, bad), Error);  // not in place
  EXPECT_THROW(g.all_reduce(filled(4, DType::i64), ReduceOp::avg), Error);
  EXPECT_THROW(g.all_reduce(full({2, 2}, 1.0, {.device = dev}).transpose(0, 1)), Error);
  g.barrier()->synchronize();
}

TEST(NcclGroup, WorldOfOne) {
  FORGE_SKIP_WITHOUT_GPU();
  auto w = init_world(LaunchEnv{}, Device::cuda(0));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->backend(), "nccl");
  EXPECT_EQ(w->device(), Device::cuda(0));
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->rank(), 0);
  check_group(*w, 1031);
  check_group(*w, 1);
  check_group(*w, 0);
  auto sub = w->new_group({0});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  check_group(*sub, 65);
  sub.reset();
  w.reset();
  shutdown();
  EXPECT_EQ(world(), nullptr);
}

TEST(NcclGroup, Ids) {
  FORGE_SKIP_WITHOUT_GPU();
  const std::string id = parallel::new_nccl_id_hex();
  EXPECT_EQ(id.size(), 256u);
  EXPECT_NO_THROW(parallel::check_nccl_id_hex(id, "test"));
  EXPECT_NE(parallel::new_nccl_id_hex(), id);
  EXPECT_THROW(parallel::check_nccl_id_hex("abc", "test"), Error);
  EXPECT_THROW(parallel::check_nccl_id_hex(std::string(256, 'g'), "test"), Error);
  EXPECT_FALSE(parallel::nccl_version().empty());
  auto g = parallel::make_nccl_group(id, 0, 1, 0);
  check_group(*g, 7);
}

// Two ranks on two GPUs in one process: one thread per rank, as two processes would run.
TEST(NcclGroup, TwoRanksTwoGpus) {
  FORGE_SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible";
  cuda_testing::on_two_gpus([](int r, const ProcessGroupPtr& g) {
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->size(), 2);
    EXPECT_EQ(g->device(), Device::cuda(r));
    check_group(*g, 1031);
    check_group(*g, 1);
    check_group(*g, 0);
    auto solo = g->new_group({1});
    EXPECT_EQ(solo != nullptr, r == 1);
    if (solo) {
      EXPECT_EQ(solo->size(), 1);
      check_group(*solo, 17);
    }
    auto both = g->new_group({0, 1});
    ASSERT_NE(both, nullptr);
    EXPECT_EQ(both->rank(), r);
    check_group(*both, 33);
    // The parent still works after its splits.
    check_group(*g, 5);
  });
}

}  // namespace
}  // namespace forge::parallel
