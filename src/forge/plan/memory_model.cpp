#include "forge/plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "forge/core/error.h"
#include "forge/parallel/pipeline_schedule.h"
#include "forge/plan/names.h"

namespace forge::plan {

const char* optimizer_name(Optimizer o) { return o == Optimizer::adamw ? "adamw" : "sgd"; }

Optimizer parse_optimizer(const std::string& s) {
  const std::string n = normalize_name(s);
  if (n == "adamw" || n == "adam") return Optimizer::adamw;
  if (n == "sgd") return Optimizer::sgd;
  FORGE_THROW("unknown optimizer '", s, "'; use adamw or sgd (with momentum)");
}

Checkpointing parse_checkpointing(const std::string& s) {
  const std::string n = normalize_name(s);
  if (n == "none" || n == "off" || n == "no") return Checkpointing::none;
  if (n == "selective") return Checkpointing::selective;
  if (n == "full" || n == "on" || n == "yes") return Checkpointing::full;
  FORGE_THROW("unknown activation checkpointing '", s,
              "'; use none, selective (recompute the attention core) or full (recompute each block)");
}

Schedule parse_schedule(const std::string& s) {
  const std::string n = normalize_name(s);
  if (n == "1f1b") return Schedule::one_f_one_b;
  if (n == "gpipe") return Schedule::gpipe;
  if (n == "zbh1" || n == "zb-h1") return Schedule::zb_h1;
  if (n == "interleaved") return Schedule::interleaved;
  FORGE_THROW("unknown pipeline schedule '", s, "'; use 1f1b, gpipe, zb-h1 or interleaved");
}

BytesPerParam bytes_per_param(Precision p, Optimizer o) {
  BytesPerParam b;
  const bool full = p == Precision::fp32 || p == Precision::tf32;
  b.param = full ? 4 : 2;
  b.grad = full ? 4 : 2;
  b.activation = full ? 4 : 2;
  if (o == Optimizer::adamw) b.optimizer = full ? 8 : 12;  // (master +) m + v
  else b.optimizer = full ? 4 : 8;                          // (master +) momentum
  return b;
}

MemoryBreakdown memory_per_gpu(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, double capacity) {
  const BytesPerParam bp = bytes_per_param(setup.precision, setup.optimizer);
  ActivationOptions ao = setup.activations;
  ao.act_bytes = bp.activation;
  const SavedTensors saved = saved_tensors(m, ao, l.tp);
  // Context parallelism: each GPU holds seq_len / cp positions of every sequence (activations per
  // token are the same: attention keeps no (s, s) scores), and the data-parallel sharding spans
  // dp x cp ranks (parallel/mesh.h).
  const int64_t b = l.micro_batch, s = m.seq_len / std::max<int64_t>(1, l.cp), t = l.tp, p = l.pp,
                d = l.dp * std::max<int64_t>(1, l.cp);
  const bool sp = l.sequence_parallel && t > 1;
  const bool forge_model = ao.model == ActivationModel::forge;
  // Note [FP8 in the plan]: an FP8 linear keeps its weight's transposed codes (a byte a weight) from
  // its forward to its backward, once per micro-batch in flight (its input's FP8 codes replace the
  // bf16 input the activation model counts, half its bytes: not subtracted, so this errs high).
  const FlopsPerToken F = flops_per_token(m);
  const double fp8_codes =
      setup.precision == Precision::fp8 ? (F.layer_forward - F.attention_forward) / 2.0 / static_cast<double>(l.tp) : 0.0;
  const double layer_full = activation_bytes(saved.layer, b, s, t, sp) + fp8_codes;
  const double layer_selective = activation_bytes(saved.layer, b, s, t, sp, /*skip_core=*/true) + fp8_codes;
  const double layer_ckpt = activation_bytes({saved.checkpoint}, b, s, t, sp);
  const double embedding = activation_bytes(saved.embedding, b, s, t, sp);
  const double head = activation_bytes(saved.head, b, s, t, sp);
  const double head_transient = activation_bytes(saved.head_transient, b, s, t, sp);
  const double grad_io = 2.0 * static_cast<double>(b * s * m.d_model) * bp.activation / (sp ? static_cast<double>(t) : 1.0);
  const double layer_stored = l.checkpointing == Checkpointing::full        ? layer_ckpt
                              : l.checkpointing == Checkpointing::selective ? layer_selective
                                                                            : layer_full;
  // The working set while a recomputed block runs its backward, on top of the stored inputs.
  // Megatron-style: the block's activations plus the gradients entering and leaving it.
  // forge (traced through its autograd, nn::GPT / nn::Llama under autograd::checkpoint, whose
  // backward holds the recomputed output y and the incoming gradient until it returns):
  //   GPT: the recomputed block (GPTBlock::forward) keeps its layer list (whose input is
  //        already stored: -h), the MLP output and the residual sum (+2h); the add's backward
  //        frees the MLP output (-h; the sum is y), the gradient entering the block lives on
  //        (+h) and the MLP's backward then holds a gradient of width f: layer + f + h.
  //   LLaMA: the add's backward frees the down projection's output (-h; the sum is y, which
  //        the list already counts), the gradient entering the block lives on (+h); the down
  //        projection's backward frees the SwiGLU output it kept (-f) and the fused SwiGLU's
  //        backward holds three f-wide gradients (its incoming one and one per input, +3f;
  //        Note [fused SwiGLU]): layer + 2f.
  const double tokens = static_cast<double>(b * s);
  const double f_gpu = static_cast<double>((m.ffn_hidden + t - 1) / t);
  const double h_gpu = static_cast<double>(m.d_model) / (sp ? static_cast<double>(t) : 1.0);
  const double forge_extra =
      (m.arch == Arch::gpt ? f_gpu + h_gpu : 2.0 * f_gpu) * bp.activation * tokens;
  const double full_working = forge_model ? layer_full + std::max(0.0, forge_extra) : layer_full + grad_io;
  const double recompute = l.checkpointing == Checkpointing::full        ? full_working
                           : l.checkpointing == Checkpointing::selective ? layer_full - layer_selective
                                                                         : 0.0;
  const std::vector<int64_t> rank_blocks = rank_layers(m, p, l.chunks());  // Note [balanced pipeline stages]
  const double dd = static_cast<double>(d);

  MemoryBreakdown best;
  best.total = -1;
  std::vector<MemoryBreakdown::Stage> stages;
  for (int64_t i = 0; i < p; ++i) {
    MemoryBreakdown r;
    r.stage = i;
    const int64_t layers = rank_blocks[static_cast<size_t>(i)];
    r.layers_on_stage = layers;
    r.params_on_gpu = stage_parameters(m, t, p, i, l.chunks());
    const double P = static_cast<double>(r.params_on_gpu);
    r.in_flight = l.schedule == Schedule::gpipe ? l.grad_accum : std::min(p - i, l.grad_accum);
    // The interleaved schedule: the chunks' micro-batches in flight at once, from the schedule
    // itself (each holds a chunk's blocks, layers / v); its warm-up runs (v - 1) P forwards more
    // than 1F1B's (Note [pipeline schedules]). As micro-batches of the whole stage: chunks / v.
    double chunk_in_flight = 0;
    if (l.chunks() > 1 && p > 1 && l.grad_accum % p == 0) {
      chunk_in_flight = static_cast<double>(parallel::pp::max_in_flight(parallel::pp::schedule(
          l.schedule, static_cast<int>(p), static_cast<int>(i), l.grad_accum, static_cast<int>(l.chunks()))));
      r.in_flight = static_cast<int64_t>(std::ceil(chunk_in_flight / static_cast<double>(l.chunks())));
    }
    const bool first = i == 0, last = i == p - 1;
    const double in_flight =
        chunk_in_flight > 0 ? chunk_in_flight / static_cast<double>(l.chunks()) : static_cast<double>(r.in_flight);
    const double head_copies = last ? (l.schedule == Schedule::gpipe ? static_cast<double>(l.grad_accum) : 1.0) : 0.0;
    const double stored_blocks = in_flight * static_cast<double>(layers) * layer_stored + (first ? in_flight * embedding : 0.0);
    // ZB-H1: a micro-batch whose weight gradients (W) wait for the drain keeps, per block, the
    // linears' inputs and output gradients from its B to its W (Note [pipeline schedules]). The
    // schedule's own count of W owed at once, less the one whose W follows its B at once (that
    // is a 1F1B backward's working set): stage s owes s + 1, so s beyond it. Measured at the
    // 0.85B LLaMA, pp 2, micro-batches of 2 x 2048, under the first ZB-H1 schedule (W lagging on
    // the first stage): the lagging stage held 2.2 GB more than under 1F1B (15.1 GB against
    // 12.9), the other none; this term gives 2.2 GB for one owed micro-batch of its 9 blocks.
    if (l.schedule == Schedule::zb_h1 && p > 1) {
      const int64_t owed = std::max<int64_t>(0, parallel::pp::max_weights_owed(parallel::pp::schedule(
                                                    parallel::PipelineSchedule::zb_h1, static_cast<int>(p),
                                                    static_cast<int>(i), l.grad_accum)) - 1);
      const double tt = static_cast<double>(t), hr = static_cast<double>(m.d_model) / (sp ? tt : 1.0);
      const double ad = static_cast<double>(m.n_head * m.head_dim()) / tt;
      const double kvd = static_cast<double>(std::max<int64_t>(1, m.n_kv_head / t) * m.head_dim());
      const double ft = static_cast<double>((m.ffn_hidden + t - 1) / t);
      const double width = m.arch == Arch::gpt ? 4 * hr + 4 * ad + 2 * ft : 4 * hr + 2 * ad + 2 * kvd + 3 * ft;
      r.weights_owed = owed;
      r.weights_owed_bytes = static_cast<double>(owed) * static_cast<double>(layers) * width * bp.activation * tokens;
    }
    const double stored = stored_blocks + head_copies * head + r.weights_owed_bytes;
    // LoRA (nn/lora.h): the frozen base holds its weights only; the adapters (`trained`, on this
    // stage's blocks) add weights, gradients and optimizer state.
    const double trained = m.lora_rank > 0 ? static_cast<double>(layers * lora_block_parameters(m, t)) : P;
    const double held = m.lora_rank > 0 ? P + trained : P;
    r.params = held * bp.param / (l.sharding().parameters() ? dd : 1.0);
    const double grads_all = trained * bp.grad / (l.sharding().gradients() ? dd : 1.0);
    r.optimizer = l.offload ? 0.0 : trained * bp.optimizer / (l.sharding().optimizer_state() ? dd : 1.0);
    r.host_bytes = l.offload ? trained * bp.optimizer / (l.sharding().optimizer_state() ? dd : 1.0) : 0.0;
    r.layer_full = layer_full;
    r.layer_checkpointed = layer_ckpt;
    r.layer_selective = layer_selective;
    r.stage_no_checkpointing = in_flight * static_cast<double>(layers) * layer_full + (first ? in_flight * embedding : 0.0) +
                               head_copies * head;
    r.stage_full_checkpointing = in_flight * static_cast<double>(layers) * layer_ckpt +
                                 (first ? in_flight * embedding : 0.0) + head_copies * head;

    if (!forge_model) {
      // Megatron-style: gradient buffers live for the whole step; the peak is the start of
      // the backward of the last micro-batch, plus the larger of the output layer's
      // transient and one recomputed layer.
      r.grads = grads_all;
      r.activations = stored;
      r.transient = std::max(last ? head_transient : 0.0, recompute);
      r.peak_phase = "start of the last micro-batch's backward (gradient buffers allocated)";
    } else {
      // forge: in one process zero_grad() frees the gradients, so they exist at the backward's
      // start only when micro-batches accumulate. Any other layout trains through
      // parallel::DataParallel, whose gradient buckets (ZeRO 0/1: every gradient; 2/3: the owned
      // slices) persist across steps (grad_buckets.h). With checkpointing the peak can come
      // later, while the last block is recomputed (the head's activations are gone, its
      // gradients and one block's are there).
      const bool persistent = l.gpus() > 1;
      const double grads_at_start = persistent || l.grad_accum > 1 ? grads_all : 0.0;
      const double phase_a = stored + (last ? head_transient : 0.0) + grads_at_start;
      double phase_b = 0;
      if (l.checkpointing != Checkpointing::none) {
        const double head_params = last ? static_cast<double>(m.vocab_size * m.d_model) / static_cast<double>(t) : 0.0;
        const double partial = persistent || l.grad_accum > 1 || m.lora_rank > 0 ? grads_all
                                                : (head_params + static_cast<double>(layer_parameters_per_gpu(m, t))) *
                                                      bp.grad / (l.sharding().gradients() ? dd : 1.0);
        phase_b = stored_blocks + recompute + partial;
      }
      const double phase_c = grads_all;  // the optimizer step
      if (phase_a >= phase_b && phase_a >= phase_c) {
        r.grads = grads_at_start;
        r.activations = stored;
        r.transient = last ? head_transient : 0.0;
        r.peak_phase = "start of backward (forge frees gradients in zero_grad)";
      } else if (phase_b >= phase_c) {
        r.grads = phase_b - stored_blocks - recompute;
        r.activations = stored_blocks;
        r.transient = recompute;
        r.peak_phase = "backward of the last block (recomputed)";
      } else {
        r.grads = grads_all;
        r.activations = 0;
        r.transient = 0;
        r.peak_phase = "optimizer step";
      }
    }

    // Communication buffers.
    if (d > 1) {
      if (l.sharding().parameters()) {
        const double layer_p = static_cast<double>(layer_parameters_per_gpu(m, t));
        r.comm_buffers += 2.0 * layer_p * bp.param + layer_p * bp.grad;  // gathered current + prefetched layer, its grads
      } else {
        r.comm_buffers += 2.0 * std::min(setup.bucket_bytes, grads_all);  // a bucket reducing, one filling
      }
      // Compressed reductions' error feedback (f32, per rank; Note [FP8 gradient reduction],
      // Note [PowerSGD]): the trained gradients' size (an upper bound under hierarchical reduction,
      // which codes 1/k of them), and FP8's all-reduce owner its slice of it again.
      const bool fp8_feedback = l.grad_compression == parallel::GradCompression::fp8 &&
                                (l.sharding().gradients() ? l.fp8_feedback_reduce_scatter : l.fp8_feedback_all_reduce);
      if (fp8_feedback) r.comm_buffers += trained * 4.0 * (l.sharding().gradients() ? 1.0 : 1.0 + 1.0 / dd);
      if (l.grad_compression == parallel::GradCompression::powersgd) r.comm_buffers += trained * 4.0;
    }
    // Ring attention: the key/value block held, the one arriving, and in backward their f32
    // gradient accumulators (one travelling, one arriving).
    if (l.cp > 1 && l.cp_kind == parallel::ContextKind::ring) {
      const double kv = static_cast<double>(b * s * 2 * std::max<int64_t>(1, m.n_kv_head / t) * m.head_dim());
      r.comm_buffers += 2.0 * kv * bp.activation + 2.0 * kv * 4.0;
    }
    const double hidden_bytes = static_cast<double>(b * s * m.d_model) * bp.activation;
    if (sp) r.comm_buffers += hidden_bytes;  // one layer input all-gathered
    if (p > 1) r.comm_buffers += 2.0 * hidden_bytes / (sp ? static_cast<double>(t) : 1.0);  // send + receive

    r.subtotal = r.params + r.grads + r.optimizer + r.activations + r.transient + r.comm_buffers;
    r.margin = setup.margin * r.subtotal;
    r.reserve = setup.reserve_bytes;
    r.total = r.subtotal + r.margin + r.reserve;
    r.capacity = capacity;
    r.headroom = capacity - r.total;
    r.fits = r.headroom >= 0;
    stages.push_back({i, layers, r.params_on_gpu, r.in_flight, r.subtotal, r.total});
    if (r.total > best.total) best = r;
  }
  best.per_stage = std::move(stages);
  return best;
}

}  // namespace forge::plan
