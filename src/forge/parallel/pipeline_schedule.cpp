// Pipeline schedules and stage boundaries (Note [pipeline schedules] in pipeline_schedule.h).
#include "forge/parallel/pipeline_schedule.h"

#include <algorithm>
#include <numeric>

#include "forge/core/error.h"

namespace forge::parallel::pp {

namespace {
std::vector<Action> interleaved(int P, int s, int64_t K, int v) {
  FORGE_CHECK(v >= 2, "pp::schedule: the interleaved schedule needs at least 2 model chunks per rank, got ", v);
  FORGE_CHECK(K % P == 0, "the interleaved pipeline schedule needs train.grad_accum (", K,
              " micro-batches) a multiple of dist.pp = ", P, "; choose train.grad_accum accordingly");
  const int64_t total = K * v;
  // The k-th forward (backward) of this rank: micro-batch and chunk.
  auto at = [&](int64_t k, bool forward) {
    const int64_t in_group = k % (static_cast<int64_t>(P) * v);
    int chunk = static_cast<int>(in_group / P);
    if (!forward) chunk = v - 1 - chunk;
    return std::make_pair((k / (static_cast<int64_t>(P) * v)) * P + k % P, chunk);
  };
  const int64_t warmup = K == P ? total : std::min<int64_t>(total, (P - s - 1) * 2 + static_cast<int64_t>(v - 1) * P);
  std::vector<Action> a;
  for (int64_t k = 0; k < warmup; ++k) {
    const auto [m, c] = at(k, true);
    a.push_back({Op::forward, m, c});
  }
  for (int64_t i = 0; i < total - warmup; ++i) {
    const auto [mf, cf] = at(warmup + i, true);
    a.push_back({Op::forward, mf, cf});
    const auto [mb, cb] = at(i, false);
    a.push_back({Op::backward, mb, cb});
  }
  for (int64_t k = total - warmup; k < total; ++k) {
    const auto [m, c] = at(k, false);
    a.push_back({Op::backward, m, c});
  }
  return a;
}
}  // namespace

std::vector<Action> schedule(PipelineSchedule kind, int stages, int stage, int64_t micro_batches, int chunks) {
  FORGE_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pp::schedule: stage ", stage, " of ", stages);
  FORGE_CHECK(micro_batches >= 1, "pp::schedule: ", micro_batches, " micro-batches; a step needs at least one");
  if (kind == PipelineSchedule::interleaved) return interleaved(stages, stage, micro_batches, chunks);
  const int64_t K = micro_batches;
  std::vector<Action> a;
  a.reserve(static_cast<size_t>(2 * K));
  if (kind == PipelineSchedule::gpipe) {
    for (int64_t m = 0; m < K; ++m) a.push_back({Op::forward, m});
    for (int64_t m = 0; m < K; ++m) a.push_back({Op::backward, m});
    return a;
  }
  const int64_t warmup = std::min<int64_t>(stages - stage - 1, K);
  const bool zb = kind == PipelineSchedule::zb_h1;
  // ZB-H1: stage s lets its W passes lag its B passes by s (Note [pipeline schedules]).
  const int64_t lag = stage;
  int64_t next_w = 0;  // ZB-H1: the oldest micro-batch whose W is still owed
  auto weight_after = [&](int64_t b) {  // after B(b): the W that lags `lag` behind, if due
    if (zb && b - next_w >= lag) a.push_back({Op::weight, next_w++});
  };
  for (int64_t m = 0; m < warmup; ++m) a.push_back({Op::forward, m});
  for (int64_t i = 0; i < K - warmup; ++i) {
    a.push_back({Op::forward, warmup + i});
    a.push_back({Op::backward, i});
    weight_after(i);
  }
  for (int64_t m = K - warmup; m < K; ++m) {
    a.push_back({Op::backward, m});
    // The drain: one owed W after each B, filling the wait for the next gradient.
    if (zb && next_w <= m) a.push_back({Op::weight, next_w++});
  }
  while (zb && next_w < K) a.push_back({Op::weight, next_w++});
  return a;
}

int64_t max_in_flight(const std::vector<Action>& actions) {
  int64_t live = 0, most = 0;
  for (const Action& x : actions) {
    if (x.op == Op::forward) ++live;
    if (x.op == Op::backward) --live;
    most = std::max(most, live);
  }
  return most;
}

int64_t max_weights_owed(const std::vector<Action>& actions) {
  int64_t owed = 0, most = 0;
  for (const Action& x : actions) {
    if (x.op == Op::backward) ++owed;
    if (x.op == Op::weight) --owed;
    most = std::max(most, owed);
  }
  return most;
}

std::pair<int64_t, int64_t> stage_blocks(int64_t n_blocks, int stages, int stage, const std::vector<int64_t>& layers) {
  FORGE_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pp::stage_blocks: stage ", stage, " of ", stages);
  if (!layers.empty()) {
    FORGE_CHECK(static_cast<int>(layers.size()) == stages, "dist.pp_layers has ", layers.size(),
                " entries for dist.pp = ", stages, " stages; give one block count per stage");
    FORGE_CHECK(std::all_of(layers.begin(), layers.end(), [](int64_t n) { return n >= 1; }),
                "dist.pp_layers: every stage needs at least one block");
    FORGE_CHECK(std::accumulate(layers.begin(), layers.end(), int64_t{0}) == n_blocks, "dist.pp_layers sums to ",
                std::accumulate(layers.begin(), layers.end(), int64_t{0}), " blocks, but the model has ", n_blocks,
                " (model.n_layer)");
    const int64_t begin = std::accumulate(layers.begin(), layers.begin() + stage, int64_t{0});
    return {begin, begin + layers[static_cast<size_t>(stage)]};
  }
  FORGE_CHECK(n_blocks >= stages, "pp::stage_blocks: ", n_blocks, " blocks over ", stages, " stages");
  const int64_t base = n_blocks / stages, extra = n_blocks % stages;
  const int64_t begin = stage * base + std::min<int64_t>(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

}  // namespace forge::parallel::pp
