#include "forge/plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "forge/core/error.h"

namespace forge::plan {

namespace {

double log2_steps(int64_t n) { return std::ceil(std::log2(static_cast<double>(n))); }

double allreduce_time(double bytes, int64_t n, const Link& k) {
  if (n <= 1 || bytes <= 0) return 0;
  return ring_allreduce_bytes(bytes, n) / k.bandwidth + 2 * log2_steps(n) * k.latency;
}

// Reduce-scatter and all-gather move the same bytes.
double half_collective_time(double bytes, int64_t n, const Link& k) {
  if (n <= 1 || bytes <= 0) return 0;
  return ring_reduce_scatter_bytes(bytes, n) / k.bandwidth + log2_steps(n) * k.latency;
}

// Bytes the optimizer step reads and writes per parameter (grad, state, weights).
// AdamW in bf16: 2 + 2 * 12 + 2 = 28 bytes; in fp32: 4 + 2 * 8 + 4 + 4 = 28; SGD: 20.
double optimizer_bytes_touched(const BytesPerParam& bp) {
  const bool has_master = bp.param < 4;
  // read grad + read/write state (+ read the weight when there is no master) + write weight
  return bp.grad + 2 * bp.optimizer + (has_master ? 0 : bp.param) + bp.param;
}

}  // namespace

double zb_h1_share(double f, double b, double w) {
  const double all = f + b + w;
  return all > 0 ? std::clamp((f + b - w) / all, 0.0, 1.0) : 1.0;
}

double ring_allreduce_bytes(double bytes, int64_t n) {
  return n <= 1 ? 0 : 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * bytes;
}
double ring_reduce_scatter_bytes(double bytes, int64_t n) {
  return n <= 1 ? 0 : static_cast<double>(n - 1) / static_cast<double>(n) * bytes;
}
double bubble_fraction(int64_t p, int64_t m) {
  return static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
}

Link group_link(const Cluster& c, int64_t n, int64_t stride) {
  Link k;
  if (n <= 1) {
    k.name = "none";
    return k;
  }
  const int64_t gpn = std::max<int64_t>(1, c.gpus_per_node);
  if (n * stride <= gpn) {
    k.bandwidth = c.intra_gbs * 1e9 * c.link_efficiency;
    k.latency = c.latency_intra_s;
    k.name = c.intra_name;
    return k;
  }
  const int64_t per_node = stride >= gpn ? 1 : std::min(n, gpn / stride);
  k.bandwidth = std::min(c.intra_gbs, static_cast<double>(per_node) * c.inter_gbs) * 1e9 * c.link_efficiency;
  k.latency = c.latency_inter_s;
  k.name = "network x" + std::to_string(per_node) + " NIC" + (per_node > 1 ? "s" : "");
  k.crosses_nodes = true;
  return k;
}

StageKernels profiled_stage(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, const GpuProfile& prof,
                            int64_t layers, bool first, bool last) {
  const int64_t t = std::max<int64_t>(1, l.tp), cpn = std::max<int64_t>(1, l.cp);
  const bool sp = l.sequence_parallel && t > 1;
  const bool fp8 = setup.precision == Precision::fp8;
  const Precision dense = fp8 ? Precision::bf16 : setup.precision;  // everything but the blocks' linears
  const Precision linear_p = fp8 ? Precision::fp8 : setup.precision;
  const double act = bytes_per_param(setup.precision, setup.optimizer).activation;
  const int64_t M = l.micro_batch * m.seq_len / cpn;  // tokens of the micro-batch on this GPU
  const double Md = static_cast<double>(M), h = static_cast<double>(m.d_model), f = static_cast<double>(m.ffn_hidden);
  const bool frozen = m.lora_rank > 0;
  const double mem_bps = memory_bytes_per_s(prof);

  // One block: its linears' GEMMs (and FP8 casts), attention, memory-bound kernels.
  StageKernels b;
  double fwd_gemm = 0, fwd_bytes = 0;  // the forward's share (recomputed under full checkpointing)
  double wgrad = 0;  // the weight-gradient GEMMs (ZB-H1's W pass)
  auto linear = [&](int64_t out, int64_t in) {
    const double fw = gemm_seconds(prof, linear_p, M, out, in);
    const double wg = frozen ? 0.0 : gemm_seconds(prof, linear_p, out, in, M);
    b.gemm += fw + gemm_seconds(prof, linear_p, M, in, out) + wg;
    fwd_gemm += fw;
    wgrad += wg;
    if (fp8) {  // casts of x, w (forward) and dy (backward)
      const double x = Md * static_cast<double>(in), w = static_cast<double>(out) * static_cast<double>(in);
      b.memory += 6.0 * (x + w + Md * static_cast<double>(out)) / mem_bps;
      fwd_bytes += 6.0 * (x + w);
    }
  };
  const int64_t hd = m.head_dim(), ht = m.d_model, f_t = m.ffn_hidden / t;
  const int64_t q_w = m.n_head / t * hd, kv_w = std::max<int64_t>(1, m.n_kv_head / t) * hd;
  if (m.arch == Arch::gpt) {
    linear(3 * q_w, ht);
    linear(ht, q_w);
    linear(f_t, ht);
    linear(ht, f_t);
  } else {
    linear(q_w + 2 * kv_w, ht);  // q, k, v packed (Note [packed QKV attention])
    linear(ht, q_w);
    linear(f_t, ht);
    linear(f_t, ht);
    linear(ht, f_t);
  }
  if (frozen) b.gemm += 6.0 * static_cast<double>(lora_block_parameters(m, t)) * Md / (gemm_efficiency(prof, dense).sustained_tflops * 1e12);
  const AttentionRate ar = attention_rate(prof, m.seq_len, hd);
  const double attn_fwd = Md * 2.0 * static_cast<double>(m.seq_len) * static_cast<double>(q_w);  // causal: half of 4 T d
  b.attention = attn_fwd / ar.fwd + 2.5 * attn_fwd / ar.bwd;
  const double hn = sp ? h / static_cast<double>(t) : h, fl = f / static_cast<double>(t);
  double fwd_el = 8.0 * hn, bwd_el = 12.0 * hn;
  if (m.arch == Arch::gpt) fwd_el += fl, bwd_el += fl;
  else fwd_el += 3.0 * fl, bwd_el += 5.0 * fl + 2.0 * hn;
  b.memory += Md * (fwd_el + bwd_el) * act / mem_bps;
  fwd_bytes += Md * fwd_el * act;
  const double block_forward = fwd_gemm + attn_fwd / ar.fwd + fwd_bytes / mem_bps;
  if (l.checkpointing == Checkpointing::full) b.recompute = block_forward;

  const double L = static_cast<double>(layers);
  StageKernels k{L * b.gemm, L * b.attention, L * b.memory, L * b.recompute, L * block_forward, L * wgrad};
  if (first) k.memory += Md * (5.0 + (m.learned_positions() ? 2.0 : 0.0)) * h * act / mem_bps;
  if (last) {
    const int64_t v = m.vocab_size / t;
    // The head's three GEMMs (GPT's tied head: the weight gradient is the embedding's), the final
    // norm and the fused cross-entropy.
    const double head_fwd = gemm_seconds(prof, dense, M, v, ht), head_w = frozen ? 0.0 : gemm_seconds(prof, dense, v, ht, M);
    k.gemm += head_fwd + gemm_seconds(prof, dense, M, ht, v) + head_w;
    k.forward += head_fwd;
    k.weight_grad += head_w;
    k.memory += Md * (10.0 * h + 2.0 * static_cast<double>(v)) * act / mem_bps;
  }
  return k;
}

TimeBreakdown step_time(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, const Cluster& c, double mfu,
                        double tokens, const GpuProfile* profile) {
  FORGE_CHECK(mfu > 0 && mfu <= 1, "--mfu must be in (0, 1], got ", mfu);
  const BytesPerParam bp = bytes_per_param(setup.precision, setup.optimizer);
  const FlopsPerToken F = flops_per_token(m);
  // Context parallelism (l.cp > 1): each GPU computes seq_len / cp tokens of every sequence (the
  // attention FLOPs per token stay the whole sequence's), and the data-parallel reduction spans
  // dp x cp ranks, consecutive after the tensor-parallel ones (cp needs pp = 1).
  const int64_t cpn = std::max<int64_t>(1, l.cp);
  const int64_t t = l.tp, p = l.pp, d = l.dp * cpn, mb = l.grad_accum;
  const bool sp = l.sequence_parallel && t > 1;
  // Note [FP8 in the plan]: with fp8 the blocks' linear GEMMs run at the FP8 peak and the rest
  // (attention's core, the head, LoRA's adapters) at bf16's, both at the given MFU; the MFU the plan
  // reports is against the bf16 peak (FLOPs done per second of bf16 capacity), as forge train's.
  const bool fp8 = setup.precision == Precision::fp8;
  const double peak = c.gpu.peak_flops(fp8 ? Precision::bf16 : setup.precision);
  const double rate = peak * mfu;
  const double linear_rate = fp8 ? c.gpu.peak_flops(Precision::fp8) * mfu : rate;
  const double tokens_mb = static_cast<double>(l.micro_batch * m.seq_len) / static_cast<double>(cpn);
  const double hidden_bytes = tokens_mb * static_cast<double>(m.d_model) * bp.activation;
  const std::vector<int64_t> rank_blocks = rank_layers(m, p, l.chunks());  // Note [balanced pipeline stages]
  const double tt = static_cast<double>(t);

  TimeBreakdown r;
  r.peak_flops = peak;
  r.tp_link = group_link(c, t, 1);
  r.dp_link = group_link(c, d, t);
  r.pp_link = group_link(c, p, t * d);
  r.cp_link = group_link(c, cpn, t);
  if (p > 1 && r.pp_link.crosses_nodes) {  // a send goes through one NIC
    r.pp_link.bandwidth = std::min(c.intra_gbs, c.inter_gbs) * 1e9 * c.link_efficiency;
    r.pp_link.name = "network x1 NIC";
  }

  double worst = -1, w_compute = 0, w_recompute = 0, w_tp = 0, w_p2p = 0, w_cp = 0, w_zb = 1;
  StageKernels w_kernels;
  int64_t max_stage_params = 0, max_stage_blocks = 0;
  for (int64_t i = 0; i < p; ++i) {
    const bool first = i == 0, last = i == p - 1;
    const int64_t layers = rank_blocks[static_cast<size_t>(i)];
    max_stage_params = std::max(max_stage_params, stage_parameters(m, t, p, i, l.chunks()));
    max_stage_blocks = std::max(max_stage_blocks, layers);
    // LoRA (nn/lora.h): the frozen base computes no weight gradients, so its matmuls' backward is
    // one forward's work (the input gradients), not two; the attention core's is still two; the
    // adapters (this GPU's share: lora_block_parameters) cost 6 FLOPs per parameter and token.
    const double lw = static_cast<double>(layers);
    const double model_flops =
        m.lora_rank > 0
            ? tokens_mb * ((lw * (2.0 * F.layer_forward + F.attention_forward) + (last ? 2.0 * F.head_forward : 0.0)) / tt +
                           lw * 6.0 * static_cast<double>(lora_block_parameters(m, t)))
            : tokens_mb * 3.0 * (lw * F.layer_forward + (last ? F.head_forward : 0.0)) / tt;
    double recompute_flops = 0;
    if (l.checkpointing == Checkpointing::full) {
      recompute_flops = tokens_mb * static_cast<double>(layers) * F.layer_forward / tt;
    } else if (l.checkpointing == Checkpointing::selective && setup.activations.attention == AttentionKind::naive) {
      recompute_flops = tokens_mb * static_cast<double>(layers) * F.attention_forward / tt;
    }
    // The blocks' linear GEMMs' share of those FLOPs (Note [FP8 in the plan]): 3 forward's worth
    // (2 with LoRA: the frozen base computes no weight gradients), recomputation 1.
    const double linear_forward = tokens_mb * lw * (F.layer_forward - F.attention_forward) / tt;
    const double linear_flops = (m.lora_rank > 0 ? 2.0 : 3.0) * linear_forward;
    const double linear_recompute = l.checkpointing == Checkpointing::full ? linear_forward : 0.0;
    double compute = linear_flops / linear_rate + (model_flops - linear_flops) / rate,
           recompute = linear_recompute / linear_rate + (recompute_flops - linear_recompute) / rate;
    StageKernels sk;
    if (profile) {  // Note [profiled step]
      sk = profiled_stage(m, setup, l, *profile, layers, first, last);
      compute = sk.total();
      recompute = sk.recompute;
    }
    double tp = 0;
    if (t > 1) {
      const bool full = l.checkpointing == Checkpointing::full;
      double n = static_cast<double>(layers * (full ? 6 : 4) + (first ? 1 : 0) + (last ? 1 : 0));
      // Sequence parallelism keeps only each region's input shard for backward and gathers it
      // again there (Megatron's choice, forge's with its default FORGE_TP_OVERLAP): one more
      // all-gather per region, two per layer, each half an all-reduce's traffic (measured on
      // 2 x H200 at tp 2: sp 4% slower than tp alone, docs/dist.md). (Full recomputation's
      // gathers are in its 6.)
      if (sp && !full) n += static_cast<double>(layers);
      tp = n * allreduce_time(hidden_bytes, t, r.tp_link);
    }
    double p2p = 0;
    if (p > 1) {
      const double msgs = (first ? 0.0 : 1.0) + (last ? 0.0 : 1.0);
      p2p = msgs * (hidden_bytes / (sp ? tt : 1.0) / r.pp_link.bandwidth + r.pp_link.latency);
    }
    double cpt = 0;
    if (cpn > 1) {
      // Per layer: the ring sends cp - 1 key/value blocks forward, and in backward cp - 1 again
      // with cp f32 gradient accumulators, each overlapped with the attention of the block held;
      // Ulysses runs four all-to-alls each way (q, k, v, output), none hidden.
      const double hd = static_cast<double>(m.head_dim());
      const double kv_w = static_cast<double>(std::max<int64_t>(1, m.n_kv_head / t)) * hd;
      const double q_w = static_cast<double>(m.n_head / t) * hd;
      const double n1 = static_cast<double>(cpn - 1);
      double per_layer = 0;
      if (l.cp_kind == parallel::ContextKind::ring) {
        const double kv_bytes = tokens_mb * 2.0 * kv_w * bp.activation;
        const double bytes = 2.0 * n1 * kv_bytes + static_cast<double>(cpn) * kv_bytes * 4.0 / bp.activation;
        const double comm = bytes / r.cp_link.bandwidth + (3.0 * n1 + 1.0) * r.cp_link.latency;
        const double attention = tokens_mb * 3.0 * F.attention_forward / tt / rate;
        per_layer = std::max(0.0, comm - attention);
      } else {
        const double bytes = 2.0 * n1 / static_cast<double>(cpn) * tokens_mb * (2.0 * q_w + 2.0 * kv_w) * bp.activation;
        per_layer = bytes / r.cp_link.bandwidth + 8.0 * r.cp_link.latency;
      }
      cpt = static_cast<double>(layers) * per_layer;
    }
    const double stage = compute + recompute + tp + p2p + cpt;
    if (stage > worst) {
      worst = stage;
      r.stage = i;
      w_compute = compute, w_recompute = recompute, w_tp = tp, w_p2p = p2p, w_cp = cpt;
      w_kernels = sk;
      // ZB-H1's share from this stage's passes: the profile's kernels, or FLOPs (linear_forward: the
      // blocks' linears' forward FLOPs, the W pass's; the forward model_flops / 3).
      const double fwd = profile ? sk.forward : model_flops / 3.0,
                   wgt = profile ? sk.weight_grad : (m.lora_rank > 0 ? 0.0 : linear_forward);
      const double all = profile ? sk.total() : model_flops;
      w_zb = zb_h1_share(fwd, all - fwd - wgt, wgt);
    }
  }
  r.stage_time = worst;
  const double m_d = static_cast<double>(mb);
  r.compute = m_d * w_compute;
  r.gemm = m_d * w_kernels.gemm;
  r.attention = m_d * w_kernels.attention;
  r.memory_bound = m_d * w_kernels.memory;
  r.recompute = m_d * w_recompute;
  r.tp_comm = m_d * w_tp;
  r.pp_p2p = m_d * w_p2p;
  r.cp_comm = m_d * w_cp;
  // ZB-H1 (Qi et al., zero-bubble pipeline parallelism): the weight-gradient passes fill the
  // drain: (p - 1)(f + b - w) of 1F1B's (p - 1)(f + b + w) (zb_h1_share, time_model.h).
  // Interleaved (Narayanan et al.): v model chunks per rank divide the fill and drain by v.
  r.zb_h1_share = w_zb;
  r.bubble = static_cast<double>(p - 1) * worst *
             (l.schedule == Schedule::zb_h1         ? w_zb
              : l.schedule == Schedule::interleaved ? 1.0 / static_cast<double>(std::max<int64_t>(1, l.virtual_stages))
                                                    : 1.0);

  // Data parallelism.
  // What the gradients, their reduction and the update cover: the stage's parameters, or a LoRA
  // run's adapters alone (the frozen base has none).
  const double P = m.lora_rank > 0 ? static_cast<double>(max_stage_blocks * lora_block_parameters(m, t))
                                   : static_cast<double>(max_stage_params);
  if (d > 1) {
    const double Sg = P * bp.grad, Sp = P * bp.param;
    const double w_b = 2.0 / 3.0 * w_compute + w_recompute;  // the backward of one micro-batch
    const double w_f = 1.0 / 3.0 * w_compute;                // the forward of one micro-batch
    const double bucket = std::min(setup.bucket_bytes, Sg);
    // The reductions' times for `bytes`: one ring over the group, or (dist.dp_reduce =
    // "hierarchical" on a group that spans nodes; Note [hierarchical data-parallel reduction]) a
    // ring of the group's k ranks on each node over the intra-node link, then N = d / k rings
    // across nodes over 1/k of the bytes, every rank of a node with its own NIC's flow.
    std::function<double(double)> AR = [&](double b) { return allreduce_time(b, d, r.dp_link); };
    std::function<double(double)> RS = [&](double b) { return half_collective_time(b, d, r.dp_link); };
    if (l.dp_reduce == parallel::DpReduce::hierarchical && r.dp_link.crosses_nodes) {
      const int64_t gpn = std::max<int64_t>(1, c.gpus_per_node);
      const int64_t k = t >= gpn ? 1 : std::min(d, gpn / t);
      if (k > 1 && d % k == 0) {
        const int64_t N = d / k;
        const Link intra{c.intra_gbs * 1e9 * c.link_efficiency, c.latency_intra_s, c.intra_name, false};
        const Link inter{c.inter_gbs * 1e9 * c.link_efficiency, c.latency_inter_s, "network", true};
        const double kd = static_cast<double>(k);
        AR = [=](double b) { return 2 * half_collective_time(b, k, intra) + allreduce_time(b / kd, N, inter); };
        RS = [=](double b) { return half_collective_time(b, k, intra) + half_collective_time(b / kd, N, inter); };
        r.dp_link.name = "hierarchical: " + intra.name + " x" + std::to_string(k) + ", then network x1 NIC per rank";
      }
    }
    const double ag = RS(Sp);  // (an all-gather moves a reduce-scatter's bytes, in the other order)
    // Note [compressed reductions in the plan]. dist.grad_compression = "fp8" (parallel/fp8_reduce.h):
    // the gradients' reductions (not the parameters' all-gathers) send 1 + 4/128 bytes a value in
    // an all-to-all and an all-gather, a ring's bytes at that width; hierarchical: only the stage
    // between nodes. Coding and decoding read and write ~24 bytes a coded value at the memory's
    // rate, in the same chain. "powersgd" (DDP; parallel/powersgd.h): r (n + m) f32 values per
    // matrix (powersgd_block_values' share of the block's parameters, the embedding counted at the
    // blocks' rate: an upper bound), and its three thin products and the error feedback, ~40 bytes
    // a parameter at the memory's rate; the buckets are reduced while backward waits: all exposed.
    const double mem_bw = profile ? memory_bytes_per_s(*profile) : c.gpu.memory_bw_gbs * 1e9 * c.hbm_efficiency;
    double ar = 0, rs = 0;
    bool exposed_all = false;
    if (l.grad_compression == parallel::GradCompression::fp8) {
      const double width = (1.0 + 4.0 / 128.0) / bp.grad;  // coded bytes per gradient byte
      const bool hier = l.dp_reduce == parallel::DpReduce::hierarchical && r.dp_link.crosses_nodes &&
                        r.dp_link.name.rfind("hierarchical", 0) == 0;
      const int64_t gpn = std::max<int64_t>(1, c.gpus_per_node);
      const int64_t k = hier ? std::min(d, gpn / std::max<int64_t>(1, t)) : 1;
      const double kd = static_cast<double>(k);
      auto codec = [&](double b) { return b / bp.grad / kd * 24.0 / mem_bw; };
      if (hier) {
        const Link intra{c.intra_gbs * 1e9 * c.link_efficiency, c.latency_intra_s, c.intra_name, false};
        const Link inter{c.inter_gbs * 1e9 * c.link_efficiency, c.latency_inter_s, "network", true};
        const int64_t N = d / k;
        AR = [=](double b) { return 2 * half_collective_time(b, k, intra) + allreduce_time(b / kd * width, N, inter) + codec(b); };
        RS = [=](double b) { return half_collective_time(b, k, intra) + half_collective_time(b / kd * width, N, inter) + codec(b); };
      } else {
        const Link link = r.dp_link;
        AR = [=](double b) { return allreduce_time(b * width, d, link) + codec(b); };
        RS = [=](double b) { return half_collective_time(b * width, d, link) + codec(b); };
      }
      ar = AR(Sg), rs = RS(Sg);
      r.dp_link.name += ", gradients in FP8";
    } else if (l.grad_compression == parallel::GradCompression::powersgd && l.zero == 0) {
      const double share = static_cast<double>(powersgd_block_values(m, l.powersgd_rank, t)) /
                           static_cast<double>(std::max<int64_t>(1, layer_parameters_per_gpu(m, t)));
      ar = AR(P * share * 4.0) + P * 40.0 / mem_bw;
      exposed_all = true;
      r.dp_link.name += ", PowerSGD rank " + std::to_string(l.powersgd_rank);
    } else {
      ar = AR(Sg), rs = RS(Sg);
    }
    auto hidden_under = [](double comm, double window) { return std::max(0.0, comm - window); };
    switch (l.zero) {
      case 0:
        r.dp_comm = ar;
        r.dp_exposed = exposed_all ? ar : hidden_under(ar, w_b) + std::min(ar, AR(bucket));
        break;
      case 1:
        r.dp_comm = rs + ag;
        r.dp_exposed = hidden_under(rs, w_b) + std::min(rs, RS(bucket)) +
                       hidden_under(ag, w_f);
        break;
      case 2:  // gradients are reduce-scattered after every micro-batch (they are sharded)
        r.dp_comm = m_d * rs + ag;
        r.dp_exposed = m_d * (hidden_under(rs, w_b) + std::min(rs, RS(bucket))) +
                       hidden_under(ag, w_f);
        break;
      default: {  // 3: parameters gathered for forward and backward of every micro-batch
        const double first_layer = ag / static_cast<double>(std::max<int64_t>(1, rank_blocks[static_cast<size_t>(r.stage)]));
        r.dp_comm = m_d * (2 * ag + rs);
        r.dp_exposed = m_d * (hidden_under(ag, w_f) + hidden_under(ag + rs, w_b) + 2 * first_layer);
        break;
      }
    }
  }

  // Optimizer step.
  const double shard = P / (l.sharding().optimizer_state() ? static_cast<double>(d) : 1.0);
  const double touched = optimizer_bytes_touched(bp);
  if (l.offload) {
    r.offload = shard * (bp.grad + bp.param) / (c.pcie_gbs * 1e9 * c.link_efficiency) + shard * touched / (c.host_gbs * 1e9);
  } else {
    r.optimizer = shard * touched / (profile ? memory_bytes_per_s(*profile) : c.gpu.memory_bw_gbs * 1e9 * c.hbm_efficiency);
  }

  r.step = r.compute + r.recompute + r.tp_comm + r.pp_p2p + r.cp_comm + r.bubble + r.dp_exposed + r.optimizer + r.offload;
  r.tokens_per_step = static_cast<double>(l.global_batch() * m.seq_len);
  r.tokens_per_s = r.tokens_per_step / r.step;
  const double gpus = static_cast<double>(l.gpus());
  r.mfu = F.model * r.tokens_per_step / (r.step * gpus * peak);
  r.steps = static_cast<int64_t>(std::ceil(tokens / r.tokens_per_step));
  r.time_to_train_s = static_cast<double>(r.steps) * r.step;
  r.gpu_hours = r.time_to_train_s * gpus / 3600.0;
  // (With a profile: the step's compute alone, every GPU busy: no communication, bubble or recompute.)
  r.ideal_gpu_hours = profile ? static_cast<double>(r.steps) * r.compute * gpus / 3600.0 : tokens * F.model / rate / 3600.0;
  r.ideal_time_s = r.ideal_gpu_hours * 3600.0 / gpus;
  return r;
}

}  // namespace forge::plan
