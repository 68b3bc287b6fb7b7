// Pipeline schedules and stage boundaries (Note [pipeline schedules] in pipeline_schedule.h).
#include "forge/dist/pipeline_schedule.h"

#include <algorithm>
#include <numeric>

#include "forge/core/error.h"

namespace forge::dist::pp {

std::vector<Action> schedule(PipelineSchedule kind, int stages, int stage, int64_t micro_batches) {
  FORGE_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pp::schedule: stage ", stage, " of ", stages);
  FORGE_CHECK(micro_batches >= 1, "pp::schedule: ", micro_batches, " micro-batches; a step needs at least one");
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
  int64_t next_w = 0;  // ZB-H1: the oldest micro-batch whose W is still owed
  auto weight_after = [&](int64_t b) {  // after B(b): the W that lags `warmup` behind, if due
    if (zb && b - next_w >= warmup) a.push_back({Op::weight, next_w++});
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

}  // namespace forge::dist::pp
