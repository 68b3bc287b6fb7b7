#include "forge/bench/collectives.h"

#include <algorithm>
#include <sstream>
#include <chrono>
#include <cstdlib>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/env.h"
#include "forge/parallel/fp8_reduce.h"
#include "forge/parallel/hierarchical_group.h"
#include "forge/parallel/world.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/device_info.h"
#endif

namespace forge::bench {

const std::vector<std::string>& collective_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                                   "send_recv"};
  return ops;
}

double busbw_factor(const std::string& op, int world) {
  const double w = world;
  if (op == "all_reduce") return world == 1 ? 1.0 : 2.0 * (w - 1) / w;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return world == 1 ? 1.0 : (w - 1) / w;
  if (op == "broadcast" || op == "send_recv") return 1.0;
  FORGE_THROW("bench collectives: unknown operation '", op,
              "'; use all_reduce, all_gather, reduce_scatter, all_to_all, broadcast or send_recv");
}

int64_t collective_elements(int64_t size_bytes, int element_size, int world) {
  FORGE_CHECK(size_bytes > 0 && element_size > 0 && world > 0, "collective_elements: bad arguments");
  const int64_t n = size_bytes / element_size / world * world;
  return std::max<int64_t>(n, world);
}

std::vector<int64_t> collective_sizes(int64_t lo, int64_t hi) {
  FORGE_CHECK(lo > 0 && hi >= lo, "bench collectives: the size range ", lo, "..", hi, " is empty; give LO <= HI, both > 0");
  std::vector<int64_t> v;
  for (int64_t s = lo; s <= hi; s *= 2) v.push_back(s);
  return v;
}

namespace {

using Clock = std::chrono::steady_clock;

// One measurement: `iters` operations after `warmup`, timed from a barrier to the host seeing
// the last one complete; the slowest rank's mean.
// `fp8`: all_reduce and reduce_scatter through it (their gradient reductions in FP8, averaged).
double time_op(parallel::ProcessGroup& pg, const std::string& op, Tensor& a, Tensor& b, int warmup, int iters,
               parallel::Fp8GradReduce* fp8 = nullptr) {
  const int W = pg.size(), r = pg.rank();
  auto once = [&]() -> parallel::WorkPtr {
    if (fp8 && op == "all_reduce") return fp8->all_reduce(0, a);
    if (fp8 && op == "reduce_scatter") return fp8->reduce_scatter(0, b, a);
    if (op == "all_reduce") return pg.all_reduce(a, parallel::ReduceOp::sum);
    if (op == "all_gather") return pg.all_gather(a, b);        // a: W*n, b: n
    if (op == "reduce_scatter") return pg.reduce_scatter(b, a, parallel::ReduceOp::sum);  // a: W*n in, b: n out
    if (op == "all_to_all") return pg.all_to_all(b, a);  // a: W blocks in, b: W blocks out
    if (op == "broadcast") return pg.broadcast(a, 0);
    // send_recv: pairs (0,1), (2,3), ...; one iteration is a message each way, so the time per
    // operation below is halved (one one-way message).
    const int peer = r ^ 1;
    if (peer >= W) return nullptr;
    if (r % 2 == 0) {
      pg.send(a, peer)->wait();
      return pg.recv(b, peer);
    }
    pg.recv(b, peer)->wait();
    return pg.send(a, peer);
  };
  const bool cpu = pg.device().is_cpu();  // MPI: in-place operations on one buffer may not overlap
  auto run = [&](int n) {
    parallel::WorkPtr last;
    for (int i = 0; i < n; ++i) {
      last = once();
      if (last && cpu) last->synchronize();
    }
    if (last) {
      // Spin on the last operation (they complete in order) rather than synchronize(), whose
      // error polling sleeps between checks and would add its granularity to small messages.
      while (!last->is_completed()) {
      }
      last->synchronize();
    }
  };
  run(warmup);
  pg.barrier()->synchronize();
  const auto t0 = Clock::now();
  run(iters);
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  if (op == "send_recv") us /= 2;
  Tensor t = full({1}, us, {.dtype = DType::f64, .device = Device::cpu()});
  if (!cpu) t = t.to(pg.device());
  pg.all_reduce(t, parallel::ReduceOp::max)->synchronize();
  return t.to(Device::cpu()).item();
}

}  // namespace

CollectivesReport run_collectives(const CollectivesOptions& opt) {
  FORGE_CHECK(!opt.sizes.empty(), "bench collectives: no sizes");
  FORGE_CHECK(opt.iters > 0 && opt.warmup >= 0, "bench collectives: --iters must be > 0 and --warmup >= 0");
  std::vector<std::string> ops = opt.ops.empty() ? collective_ops() : opt.ops;
  for (const auto& op : ops) (void)busbw_factor(op, 1);  // unknown names fail before any work
  const parallel::LaunchEnv env = parallel::launch_env();
  Device device = opt.device;
  if (device.is_cuda()) device = Device::cuda(env.local_rank);
  auto pg = parallel::world() ? parallel::world() : parallel::init_world(env, device);
  NoGradGuard no_grad;
  std::string nodes;
  if (opt.hierarchical || opt.link_gbps > 0) {
    const int node_size = opt.node_size > 0 ? opt.node_size : env.local_world_size;
    std::vector<int> ranks(static_cast<size_t>(pg->size()));
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
    pg = parallel::node_aware_group(pg, ranks, {.node_size = node_size, .hierarchical = opt.hierarchical,
                                                .link = {.gbps = opt.link_gbps, .latency_us = opt.link_latency_us}});
    std::ostringstream o;
    o << pg->size() / std::min(node_size, pg->size()) << " node(s) of " << std::min(node_size, pg->size()) << " rank(s)"
      << (opt.hierarchical ? ", reduced within each node first" : ", flat");
    if (opt.link_gbps > 0) o << ", paced link of " << opt.link_gbps << " Gb/s (" << opt.link_latency_us << " us per step)";
    nodes = o.str();
  }

  CollectivesReport rep;
  rep.nodes = nodes;
  rep.options = opt;
  rep.backend = pg->backend();
  rep.device = device.str();
  rep.world = pg->size();
  rep.rank = pg->rank();
  rep.launcher = parallel::launcher_name(env.launcher);
#ifdef FORGE_WITH_CUDA
  if (device.is_cuda()) rep.device_name = cuda::device_properties(device.index).name;
#endif
  for (const char* v : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_HOSTID",
                        "NCCL_SOCKET_IFNAME"})
    if (const char* s = std::getenv(v)) rep.transport_env += std::string(rep.transport_env.empty() ? "" : " ") + v + "=" + s;
  const int W = pg->size();
  const int e = static_cast<int>(element_size(opt.dtype));
  for (const auto& op : ops) {
    if (op == "send_recv" && W < 2) {
      rep.notes.push_back("send_recv needs at least 2 ranks: skipped");
      continue;
    }
    for (int64_t bytes : opt.sizes) {
      const int64_t n = collective_elements(bytes, e, W);
      const TensorOptions to{.dtype = opt.dtype, .device = device};
      // Random data (never zeros); a is the whole buffer, b the per-rank part where there is one.
      Tensor a = rand({n}, to), b;
      if (op == "all_gather" || op == "reduce_scatter") b = rand({n / W}, to);
      else if (op == "send_recv" || op == "all_to_all") b = empty({n}, to);
      CollectiveResult res;
      res.op = op;
      res.elements = n;
      res.bytes = n * e;
      // --grad-compression fp8: the reduction as forge train's gradient buckets send it, one bucket
      // of this size (Note [FP8 gradient reduction]).
      std::unique_ptr<parallel::Fp8GradReduce> fp8;
      parallel::DpState st;
      if (opt.fp8 && (op == "all_reduce" || op == "reduce_scatter") && W > 1) {
        st.group = pg;
        st.device = device;
        st.sharding = parallel::Sharding::from_stage(op == "reduce_scatter" ? 2 : 0);
        parallel::DpBucket b1;
        b1.numel = b1.padded = n, b1.shard = n / W, b1.dtype = opt.dtype;
        st.buckets.push_back(b1);
        fp8 = std::make_unique<parallel::Fp8GradReduce>(st);
      }
      res.time_us = time_op(*pg, op, a, b, opt.warmup, opt.iters, fp8.get());
      if (fp8) res.sent_fraction = fp8->sent_fraction();
      res.algbw_gbs = static_cast<double>(res.bytes) / (res.time_us * 1e-6) / 1e9;
      res.busbw_gbs = res.algbw_gbs * busbw_factor(op, W);
      rep.results.push_back(res);
    }
  }
  return rep;
}

nlohmann::json to_json(const CollectivesReport& r) {
  nlohmann::json j = {{"bench", "collectives"}, {"backend", r.backend},   {"device", r.device},
                      {"device_name", r.device_name}, {"world", r.world}, {"launcher", r.launcher},
                      {"dtype", dtype_name(r.options.dtype)}, {"warmup", r.options.warmup},
                      {"iters", r.options.iters},     {"transport_env", r.transport_env}, {"nodes", r.nodes},
                      {"grad_compression", r.options.fp8 ? "fp8" : "none"},
                      {"notes", r.notes},             {"results", nlohmann::json::array()}};
  for (const auto& x : r.results)
    j["results"].push_back({{"op", x.op}, {"bytes", x.bytes}, {"elements", x.elements}, {"time_us", x.time_us},
                            {"algbw_gbs", x.algbw_gbs}, {"busbw_gbs", x.busbw_gbs}, {"sent_fraction", x.sent_fraction}});
  return j;
}

}  // namespace forge::bench
