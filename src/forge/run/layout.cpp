#include "forge/run/layout.h"

#include <algorithm>

#include "forge/core/error.h"
#include "forge/nn/model_registry.h"
#include "forge/parallel/mesh.h"

namespace forge::train {

void check_vocab_splits(const RunConfig& cfg, int64_t vocab_size) {
  const int64_t tp = cfg.dist.tp;
  FORGE_CHECK(vocab_size <= 0 || vocab_size % tp == 0, "model.vocab_size = ", vocab_size,
              " is not divisible by dist.tp = ", tp, " (the embedding and head are split by vocabulary rows); set "
              "model.vocab_size to a multiple of ", tp, " (e.g. ", (vocab_size + tp - 1) / tp * tp, ") or lower dist.tp");
}

void set_reduction_keys(const RunConfig& cfg, parallel::Layout& l) {
  l.dp_reduce = cfg.dist.dp_reduce == "hierarchical" ? parallel::DpReduce::hierarchical : parallel::DpReduce::flat;
  l.node_size = cfg.dist.node_size;
  l.link_gbps = cfg.dist.link_gbps;
  l.link_latency_us = cfg.dist.link_latency_us;
  l.grad_compression = parallel::grad_compression_from_name(cfg.dist.grad_compression);
  l.powersgd_rank = cfg.dist.powersgd_rank;
  l.fp8_feedback_all_reduce = cfg.dist.fp8_error_feedback != "off";
  l.fp8_feedback_reduce_scatter = cfg.dist.fp8_error_feedback == "on";
}

parallel::Layout run_layout(const RunConfig& cfg, int world_size) {
  const int tp = static_cast<int>(cfg.dist.tp), pp = static_cast<int>(cfg.dist.pp), cp = static_cast<int>(cfg.dist.cp);
  const parallel::Mesh mesh = parallel::Mesh::carve(world_size, 0, tp, pp, cp);  // 1.
  const auto& m = cfg.model;
  if (cfg.is_language_model()) {                                     // 2.
    const nn::TransformerShape shape = nn::transformer_shape(m);    // kv-heads and FFN width resolved
    const int64_t kv = shape.n_kv_head, ffn = shape.ffn_hidden;
    FORGE_CHECK(m.n_head % tp == 0, "model.n_head = ", m.n_head, " is not divisible by dist.tp = ", tp,
                " (each tensor-parallel rank computes n_head / tp heads); choose dist.tp a divisor of ", m.n_head);
    FORGE_CHECK(kv % tp == 0 || tp % kv == 0, "the ", kv,
                " key/value heads (model.n_kv_head) and dist.tp = ", tp,
                " do not split: kv-heads must be a multiple of tp, or divide it (then they are replicated); choose "
                "dist.tp accordingly");
    FORGE_CHECK(ffn % tp == 0, "the FFN width ", ffn, " (", nn::model_family(m.type).ffn_rule,
                ") is not divisible by dist.tp = ", tp, "; choose dist.tp a divisor of it");
    check_vocab_splits(cfg, m.vocab_size);
    if (cp > 1 && cfg.dist.cp_kind == "ulysses") {
      const int64_t heads = m.n_head / tp, kv_heads = std::max<int64_t>(kv / tp, 1);
      FORGE_CHECK(heads % cp == 0 && kv_heads % cp == 0, "dist.cp_kind = \"ulysses\" gives each of the dist.cp = ",
                  cp, " ranks a share of the heads, but each tensor-parallel rank has ", heads, " query and ", kv_heads,
                  " key/value head(s), not both divisible by ", cp, "; use dist.cp_kind = \"ring\" or a dist.cp that "
                  "divides both");
    }
    FORGE_CHECK(m.n_layer >= pp, "dist.pp = ", pp, " pipeline stages need at least as many blocks, but model.n_layer = ",
                m.n_layer, "; lower dist.pp to <= ", m.n_layer);
    const int64_t v = cfg.dist.pp_virtual_stages;
    FORGE_CHECK(m.n_layer >= pp * v, "dist.pp = ", pp, " x dist.pp_virtual_stages = ", v, " = ", pp * v,
                " model chunks need at least as many blocks, but model.n_layer = ", m.n_layer,
                "; lower dist.pp_virtual_stages");
  }
  parallel::Layout l;
  l.dp = mesh.dp();
  l.tp = tp;
  l.pp = pp;
  l.cp = cp;
  l.cp_kind = cfg.dist.cp_kind == "ulysses" ? parallel::ContextKind::ulysses : parallel::ContextKind::ring;
  l.zero = parallel::Sharding::from_stage(cfg.dist.zero_stage).stage();
  l.offload = cfg.dist.offload_optimizer;
  l.sequence_parallel = cfg.dist.sequence_parallel;
  l.schedule = cfg.dist.pp_schedule == "gpipe"   ? parallel::PipelineSchedule::gpipe
               : cfg.dist.pp_schedule == "zb-h1"       ? parallel::PipelineSchedule::zb_h1
               : cfg.dist.pp_schedule == "interleaved" ? parallel::PipelineSchedule::interleaved
                                                       : parallel::PipelineSchedule::one_f_one_b;
  l.virtual_stages = cfg.dist.pp_virtual_stages;
  set_reduction_keys(cfg, l);
  FORGE_CHECK(tp == 1 || !l.offload, "dist.offload_optimizer = true with dist.tp = ", tp,
              " is not supported yet (the tensor-parallel gradient reductions run after the offloaded gradients "
              "leave the GPU); set dist.offload_optimizer = false");
  l.checkpointing = m.checkpoint_activations ? parallel::Checkpointing::full : parallel::Checkpointing::none;
  {                                                                  // 3.
    const int64_t K = cfg.train.grad_accum, B = cfg.train.batch_size;
    FORGE_CHECK(B % (l.dp * K) == 0, "train.batch_size = ", B, " is not divisible by the world size ", world_size,
                l.dp == world_size ? std::string()
                                   : std::string(cp > 1 ? " / (dist.tp x dist.pp x dist.cp)" : " / (dist.tp x dist.pp)") +
                                         " = dp " + std::to_string(l.dp),
                K > 1 ? " x train.grad_accum = " + std::to_string(K) : std::string(),
                "; train.batch_size is the global batch (Note [global batch]): make it a multiple of ", l.dp * K);
    l.grad_accum = K;
    l.micro_batch = B / (l.dp * K);
  }
  return l;
}

}  // namespace forge::train
