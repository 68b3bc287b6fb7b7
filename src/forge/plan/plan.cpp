#include "forge/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "forge/core/error.h"
#include "forge/plan/names.h"

namespace forge::plan {

using nlohmann::json;

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::vector<int64_t> tp_choices(const ModelSpec& m) {
  std::vector<int64_t> out;
  for (int64_t t : divisors(m.n_head))
    if (t <= m.n_kv_head ? m.n_kv_head % t == 0 : t % m.n_kv_head == 0) out.push_back(t);
  return out;
}

std::string memory_reason(const MemoryBreakdown& mem) {
  std::ostringstream os;
  os << "does not fit: needs " << gib(mem.total, 1) << " GB of " << gib(mem.capacity, 1) << " GB (stage " << mem.stage
     << ": params " << gib(mem.params, 1) << ", grads " << gib(mem.grads, 1) << ", optimizer " << gib(mem.optimizer, 1)
     << ", activations " << gib(mem.activations + mem.transient, 1) << ", buffers " << gib(mem.comm_buffers, 1)
     << ", margin+reserve " << gib(mem.margin + mem.reserve, 1) << ")";
  return os.str();
}

}  // namespace

Cluster make_cluster(const GpuSpec& gpu, int64_t gpus, int64_t gpus_per_node) {
  Cluster c;
  c.gpu = gpu;
  c.gpus = gpus;
  c.gpus_per_node = gpu.is_cpu ? 1 : std::min(gpus, gpus_per_node);
  c.pcie_gbs = gpu.pcie_gbs > 0 ? gpu.pcie_gbs : 32;
  c.intra_gbs = gpu.nvlink_gbs > 0 ? gpu.nvlink_gbs : c.pcie_gbs;
  c.intra_name = gpu.nvlink_gbs > 0 ? (normalize_name(gpu.name).find("ascend") == 0 ? "HCCS" : "NVLink") : "PCIe";
  c.inter_gbs = 25;
  return c;
}

std::string layout_problem(const PlanInput& in, const Layout& l) {
  const ModelSpec& m = in.model;
  std::ostringstream os;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.micro_batch < 1 || l.grad_accum < 1)
    return "dp, tp, pp, micro-batch and grad-accum must all be >= 1";
  if (l.cp < 1) return "cp must be >= 1";
  if (l.gpus() != in.cluster.gpus) {
    os << "dp x tp x pp" << (l.cp > 1 ? " x cp" : "") << " = " << l.dp << " x " << l.tp << " x " << l.pp;
    if (l.cp > 1) os << " x " << l.cp;
    os << " = " << l.gpus() << " GPUs, but --gpus is " << in.cluster.gpus;
    return os.str();
  }
  if (l.cp > 1) {
    if (m.seq_len % (2 * l.cp) != 0) {
      os << "seq " << m.seq_len << " does not cut into 2 x cp = " << 2 * l.cp << " equal chunks (context parallelism)";
      return os.str();
    }
    if (l.pp > 1) return "cp with pp > 1 is not supported by forge train yet";
    const int64_t heads = m.n_head / l.tp, kv = std::max<int64_t>(1, m.n_kv_head / l.tp);
    if (l.cp_kind == parallel::ContextKind::ulysses && (heads % l.cp != 0 || kv % l.cp != 0)) {
      os << "ulysses gives each of cp = " << l.cp << " GPUs a share of the " << heads << " query and " << kv
         << " key/value heads per tensor-parallel rank, which do not divide; use --cp-kind ring";
      return os.str();
    }
  }
  if (in.cluster.gpu.is_cpu && l.gpus() != 1) return "the cpu device plans one process: use --gpus 1 (dp = tp = pp = 1)";
  if (m.n_head % l.tp != 0) {
    os << "heads = " << m.n_head << " are not divisible by tp = " << l.tp
       << " (each tensor-parallel rank takes heads / tp of them); tp can be " << list(tp_choices(m));
    return os.str();
  }
  if (l.tp <= m.n_kv_head ? m.n_kv_head % l.tp != 0 : l.tp % m.n_kv_head != 0) {
    os << "kv-heads = " << m.n_kv_head << " and tp = " << l.tp
       << " do not divide one another (K/V heads are split over tp, or replicated when tp is a multiple of them); tp "
          "can be "
       << list(tp_choices(m));
    return os.str();
  }
  if (m.n_layer < l.pp * l.chunks()) {
    os << "layers = " << m.n_layer << " cannot fill pp = " << l.pp;
    if (l.chunks() > 1) os << " x " << l.chunks() << " virtual stages";
    os << " (each pipeline stage needs at least one block); use at most " << m.n_layer / l.chunks() << " stages";
    return os.str();
  }
  if (l.global_batch() != in.global_batch) {
    const int64_t per = l.micro_batch * l.dp;
    if (in.global_batch % per != 0) {
      os << "batch = " << in.global_batch << " sequences is not divisible by micro-batch x dp = " << l.micro_batch << " x "
         << l.dp << " = " << per << "; choose a batch that is a multiple of " << per
         << ", or a micro-batch dividing batch / dp";
    } else {
      os << "micro-batch x grad-accum x dp = " << l.micro_batch << " x " << l.grad_accum << " x " << l.dp << " = "
         << l.global_batch() << " sequences, but --batch is " << in.global_batch << " (grad-accum would be "
         << in.global_batch / per << ")";
    }
    return os.str();
  }
  if (l.zero < 0 || l.zero > 3) return "ZeRO stage must be 0, 1, 2 or 3, got " + std::to_string(l.zero);
  if (l.sharding().gradients() && l.pp > 1)
    return "ZeRO-" + std::to_string(l.zero) +
           " with pipeline parallelism is not supported (gradients would be reduce-scattered after every "
           "micro-batch; DeepSpeed and Megatron allow only ZeRO-1 with pp > 1)";
  if (l.grad_compression == parallel::GradCompression::powersgd && (l.zero != 0 || l.pp > 1))
    return "PowerSGD with ZeRO-" + std::to_string(l.zero) + " and pp = " + std::to_string(l.pp) +
           " is not supported (it compresses DDP's all-reduces: ZeRO-0, pp = 1); use --grad-compression fp8 with ZeRO "
           "or pipeline stages";
  if (l.tp > in.cluster.gpus_per_node) {
    os << "tp = " << l.tp << " spans nodes (" << in.cluster.gpus_per_node
       << " GPUs per node): tensor-parallel all-reduces run every layer and belong on the intra-node link";
    return os.str();
  }
  if (l.checkpointing == Checkpointing::selective && in.setup.activations.model == ActivationModel::forge)
    return "forge checkpoints whole blocks (model.checkpoint_activations): use --checkpointing full or none with the "
           "forge activation model";
  return "";
}

void check_input(const PlanInput& in) {
  in.model.validate();
  FORGE_CHECK(in.tokens > 0, "--tokens must be > 0, got ", in.tokens);
  FORGE_CHECK(in.global_batch > 0, "--batch must be > 0 sequences, got ", in.global_batch);
  FORGE_CHECK(in.mfu > 0 && in.mfu <= 1, "--mfu must be in (0, 1] (e.g. 0.4 for 40% of the dense peak), got ", in.mfu);
  FORGE_CHECK(in.cluster.gpus >= 1, "--gpus must be >= 1, got ", in.cluster.gpus);
  FORGE_CHECK(in.cluster.gpus_per_node >= 1, "--gpus-per-node must be >= 1, got ", in.cluster.gpus_per_node);
  FORGE_CHECK(in.cluster.intra_gbs > 0 && in.cluster.inter_gbs > 0, "link bandwidths must be > 0 GB/s");
  FORGE_CHECK(in.setup.margin >= 0 && in.setup.margin < 1, "--margin must be in [0, 1), got ", in.setup.margin);
  FORGE_CHECK(in.setup.reserve_bytes >= 0, "--reserve-gb must be >= 0");
  (void)in.cluster.gpu.peak_flops(in.setup.precision);  // throws naming the modes the device has
  const std::string problem = layout_problem(in, in.layout);
  FORGE_CHECK(problem.empty(), "layout ", in.layout.describe(), ": ", problem);
}

PlanResult evaluate_layout(const PlanInput& in, const Layout& l) {
  PlanResult r;
  r.layout = l;
  r.params = count_parameters(in.model);
  r.flops = flops_per_token(in.model);
  r.total_flops = in.tokens * r.flops.model;
  r.memory = memory_per_gpu(in.model, in.setup, l, in.cluster.gpu.memory_gb * 1e9);
  r.time = step_time(in.model, in.setup, l, in.cluster, in.mfu, in.tokens, in.profile ? &*in.profile : nullptr);
  r.cost = run_cost(in.cost, r.time.gpu_hours, l.gpus(), in.cluster.gpus_per_node, in.cluster.gpu.tdp_w);
  return r;
}

PlanResult evaluate(const PlanInput& in) {
  check_input(in);
  return evaluate_layout(in, in.layout);
}

SearchResult search(const PlanInput& in, const SearchSpace& fixed) {
  {  // everything but the layout
    in.model.validate();
    FORGE_CHECK(in.tokens > 0, "--tokens must be > 0, got ", in.tokens);
    FORGE_CHECK(in.global_batch > 0, "--batch must be > 0 sequences, got ", in.global_batch);
    FORGE_CHECK(in.mfu > 0 && in.mfu <= 1, "--mfu must be in (0, 1], got ", in.mfu);
    (void)in.cluster.gpu.peak_flops(in.setup.precision);
  }
  const int64_t n = in.cluster.gpus;
  auto pick = [](const auto& opt, std::vector<std::decay_t<decltype(*opt)>> all) {
    return opt ? std::vector<std::decay_t<decltype(*opt)>>{*opt} : all;
  };
  std::vector<int64_t> tps;
  for (int64_t t : divisors(n))
    if (t <= in.model.n_head) tps.push_back(t);
  std::vector<int64_t> mbs;
  for (int64_t b = 1; b <= in.global_batch && b <= 256; b *= 2) mbs.push_back(b);
  std::vector<Checkpointing> ckpts = {Checkpointing::none, Checkpointing::full};
  if (in.setup.activations.attention == AttentionKind::naive && in.setup.activations.model == ActivationModel::megatron)
    ckpts.insert(ckpts.begin() + 1, Checkpointing::selective);

  SearchResult out;
  const int64_t cpn = std::max<int64_t>(1, in.layout.cp);  // context parallelism: as given, not searched
  for (int64_t t : pick(fixed.tp, tps)) {
    if (n % (t * cpn) != 0) continue;
    for (int64_t p : pick(fixed.pp, divisors(n / t / cpn))) {
      if ((n / t / cpn) % p != 0) continue;
      const int64_t d = n / t / p / cpn;
      if (fixed.dp && *fixed.dp != d) continue;
      // Micro-batches that divide the batch per data-parallel rank (the others are not layouts
      // of this batch); when there is none the layout is rejected once, with the reason.
      std::vector<int64_t> bs;
      for (int64_t b : pick(fixed.micro_batch, mbs))
        if (in.global_batch % (b * d) == 0) bs.push_back(b);
      if (bs.empty()) bs.push_back(fixed.micro_batch ? *fixed.micro_batch : 1);
      for (int64_t b : bs) {
        std::vector<int> zeros = d > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0};
        // Both reductions where the data-parallel group spans nodes (Note [hierarchical data-parallel
        // reduction]); elsewhere they are the same layout.
        const std::vector<parallel::DpReduce> reductions =
            d > 1 && n > in.cluster.gpus_per_node
                ? std::vector<parallel::DpReduce>{parallel::DpReduce::flat, parallel::DpReduce::hierarchical}
                : std::vector<parallel::DpReduce>{in.layout.dp_reduce};
        for (int z : pick(fixed.zero, zeros)) {
          for (bool off : pick(fixed.offload, {false, true})) {
            for (Checkpointing ck : pick(fixed.checkpointing, ckpts)) {
              for (parallel::DpReduce red : pick(fixed.dp_reduce, reductions)) {
                Layout l = in.layout;  // keeps the schedule
                l.dp_reduce = red;
                l.dp = d, l.tp = t, l.pp = p, l.micro_batch = b, l.zero = z, l.offload = off, l.checkpointing = ck;
                l.sequence_parallel = fixed.sequence_parallel ? *fixed.sequence_parallel : t > 1;
                l.grad_accum = in.global_batch % (b * d) == 0 ? in.global_batch / (b * d) : 1;
                ++out.considered;
                std::string why = layout_problem(in, l);
                if (!why.empty()) {
                  const bool topo = why.find("spans nodes") != std::string::npos;
                  const bool unsupported = why.find("not supported") != std::string::npos ||
                                           why.find("forge checkpoints") != std::string::npos;
                  out.rejected.push_back({l, topo ? "topology" : unsupported ? "unsupported" : "divisibility", why});
                  continue;
                }
                PlanResult r = evaluate_layout(in, l);
                if (!r.memory.fits) {
                  out.rejected.push_back({l, "memory", memory_reason(r.memory), r.memory.total});
                  continue;
                }
                out.fits.push_back(std::move(r));
              }
            }
          }
        }
      }
    }
  }
  // By time to 4 significant digits (what the table shows), then by memory: of two equally
  // fast layouts the one with more headroom comes first.
  auto rounded = [](double v) {
    if (!(v > 0) || !std::isfinite(v)) return v;
    const double scale = std::pow(10.0, std::floor(std::log10(v)) - 3);
    return std::round(v / scale) * scale;
  };
  std::stable_sort(out.fits.begin(), out.fits.end(), [&](const PlanResult& a, const PlanResult& b) {
    const double ta = rounded(a.time.time_to_train_s), tb = rounded(b.time.time_to_train_s);
    if (ta != tb) return ta < tb;
    return a.memory.total < b.memory.total;
  });
  return out;
}

// ---- JSON -------------------------------------------------------------------------------------

json layout_json(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"micro_batch", l.micro_batch},
          {"grad_accum", l.grad_accum},
          {"zero", l.zero},
          {"offload", l.offload},
          {"checkpointing", checkpointing_name(l.checkpointing)},
          {"sequence_parallel", l.sequence_parallel},
          {"cp", l.cp},
          {"cp_kind", l.cp_kind == parallel::ContextKind::ulysses ? "ulysses" : "ring"},
          {"schedule", schedule_name(l.schedule)},
          {"dp_reduce", l.dp_reduce == parallel::DpReduce::hierarchical ? "hierarchical" : "flat"},
          {"grad_compression", parallel::grad_compression_name(l.grad_compression)},
          {"gpus", l.gpus()}};
}

namespace {

json link_json(const Link& k) {
  return {{"name", k.name}, {"gbs", k.bandwidth / 1e9}, {"latency_us", k.latency * 1e6}, {"crosses_nodes", k.crosses_nodes}};
}

json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

json plan_json(const PlanInput& in, const PlanResult& r) {
  const ModelSpec& m = in.model;
  const auto& mem = r.memory;
  const auto& t = r.time;
  const auto& c = r.cost;
  const BytesPerParam bp = bytes_per_param(in.setup.precision, in.setup.optimizer);
  json j;
  j["model"] = {{"name", m.name},          {"arch", arch_name(m.arch)},     {"n_layer", m.n_layer},
                {"d_model", m.d_model},    {"n_head", m.n_head},            {"n_kv_head", m.n_kv_head},
                {"ffn_hidden", m.ffn_hidden}, {"vocab_size", m.vocab_size}, {"seq_len", m.seq_len},
                {"block_size", m.block_size}, {"bias", m.bias},             {"tied_head", m.tied_head()}};
  j["parameters"] = {{"total", r.params.total},
                     {"embedding", r.params.embedding},
                     {"position", r.params.position},
                     {"per_block", r.params.block.total()},
                     {"blocks", r.params.blocks},
                     {"final_norm", r.params.final_norm},
                     {"head", r.params.head},
                     {"matmul", r.params.matmul},
                     {"per_gpu", mem.params_on_gpu}};
  j["flops"] = {{"per_token", r.flops.model},
                {"per_token_6n", r.flops.six_n},
                {"attention_per_token", 3 * static_cast<double>(m.n_layer) * r.flops.attention_forward},
                {"forward_per_token", r.flops.forward},
                {"tokens", in.tokens},
                {"total", r.total_flops}};
  j["hardware"] = {{"gpu", in.cluster.gpu.name},
                   {"gpus", in.cluster.gpus},
                   {"gpus_per_node", in.cluster.gpus_per_node},
                   {"peak_tflops", t.peak_flops / 1e12},
                   {"memory_gb", in.cluster.gpu.memory_gb},
                   {"intra_node", {{"link", in.cluster.intra_name}, {"gbs", in.cluster.intra_gbs}}},
                   {"inter_node_gbs_per_gpu", in.cluster.inter_gbs},
                   {"link_efficiency", in.cluster.link_efficiency},
                   {"source", in.cluster.gpu.source}};
  j["training"] = {{"precision", precision_name(in.setup.precision)},
                   {"optimizer", optimizer_name(in.setup.optimizer)},
                   {"bytes_per_param", {{"params", bp.param}, {"grads", bp.grad}, {"optimizer", bp.optimizer}}},
                   {"global_batch", in.global_batch},
                   {"seq_len", m.seq_len},
                   {"tokens_per_step", t.tokens_per_step},
                   {"mfu", in.profile ? nlohmann::json(nullptr) : nlohmann::json(in.mfu)},
                   {"efficiency", in.profile ? nlohmann::json{{"model", "profile"}, {"profile", in.profile->gpu},
                                                              {"measured_on", in.profile->measured_on},
                                                              {"source", in.profile->source}}
                                             : nlohmann::json{{"model", "mfu"}, {"mfu", in.mfu}}},
                   {"activation_model", activation_model_name(in.setup.activations.model)},
                   {"attention", attention_name(in.setup.activations.attention)},
                   {"dropout", in.setup.activations.dropout}};
  j["layout"] = layout_json(r.layout);
  j["memory"] = {{"stage", mem.stage},
                 {"params", mem.params},
                 {"grads", mem.grads},
                 {"optimizer", mem.optimizer},
                 {"activations", mem.activations},
                 {"transient", mem.transient},
                 {"comm_buffers", mem.comm_buffers},
                 {"subtotal", mem.subtotal},
                 {"margin", mem.margin},
                 {"margin_fraction", in.setup.margin},
                 {"reserve", mem.reserve},
                 {"total", mem.total},
                 {"capacity", mem.capacity},
                 {"headroom", mem.headroom},
                 {"fits", mem.fits},
                 {"peak_phase", mem.peak_phase},
                 {"in_flight_micro_batches", mem.in_flight},
                 {"layers_on_stage", mem.layers_on_stage},
                 {"host_bytes", mem.host_bytes},
                 {"activations_per_layer",
                  {{"no_checkpointing", mem.layer_full},
                   {"selective", mem.layer_selective},
                   {"full_checkpointing", mem.layer_checkpointed}}},
                 {"activations_stage",
                  {{"no_checkpointing", mem.stage_no_checkpointing}, {"full_checkpointing", mem.stage_full_checkpointing}}}};
  j["memory"]["per_stage"] = nlohmann::json::array();
  for (const auto& st : mem.per_stage)
    j["memory"]["per_stage"].push_back({{"stage", st.stage},
                                        {"layers", st.layers},
                                        {"params_on_gpu", st.params_on_gpu},
                                        {"in_flight_micro_batches", st.in_flight},
                                        {"subtotal", st.subtotal},
                                        {"total", st.total}});
  j["layout"]["stage_layers"] = rank_layers(m, r.layout.pp, r.layout.chunks());
  j["layout"]["virtual_stage_layers"] = stage_layers(m, r.layout.pp * r.layout.chunks());
  j["time"] = {{"stage", t.stage},
               {"stage_time_per_micro_batch", t.stage_time},
               {"compute", t.compute},
               {"recompute", t.recompute},
               {"tp_comm", t.tp_comm},
               {"pp_p2p", t.pp_p2p},
               {"cp_comm", t.cp_comm},
               {"bubble", t.bubble},
               {"bubble_fraction", bubble_fraction(r.layout.pp, r.layout.grad_accum)},
               {"dp_comm", t.dp_comm},
               {"dp_exposed", t.dp_exposed},
               {"optimizer", t.optimizer},
               {"offload", t.offload},
               {"gemm", t.gemm},
               {"attention", t.attention},
               {"memory_bound", t.memory_bound},
               {"step", t.step},
               {"tokens_per_step", t.tokens_per_step},
               {"tokens_per_s", t.tokens_per_s},
               {"tokens_per_s_per_gpu", t.tokens_per_s / static_cast<double>(r.layout.gpus())},
               {"mfu", t.mfu},
               {"steps", t.steps},
               {"time_to_train_s", t.time_to_train_s},
               {"time_to_train_days", t.time_to_train_s / 86400.0},
               {"gpu_hours", t.gpu_hours},
               {"ideal_gpu_hours", t.ideal_gpu_hours},
               {"links", {{"tp", link_json(t.tp_link)}, {"dp", link_json(t.dp_link)}, {"pp", link_json(t.pp_link)}}}};
  json rent = {{"per_gpu_hour", c.rent_per_hour}, {"total", c.rent_known ? json(c.rent_total) : json(nullptr)}};
  json buy = {{"capex_per_gpu", c.capex_per_gpu},
              {"capex_total", c.buy_known ? json(c.capex_total) : json(nullptr)},
              {"power_w_per_gpu", c.power_w},
              {"energy_kwh", c.energy_kwh},
              {"energy_cost", c.energy_cost},
              {"owned_per_gpu_hour", c.buy_known ? json(c.owned_per_gpu_hour) : json(nullptr)},
              {"run_cost", c.buy_known ? json(c.buy_run_cost) : json(nullptr)},
              {"years", in.cost.years},
              {"utilisation", in.cost.utilisation},
              {"electricity_per_kwh", in.cost.electricity},
              {"pue", in.cost.pue}};
  j["cost"] = {{"gpu_hours", c.gpu_hours},
               {"rent", rent},
               {"buy", buy},
               {"break_even_hours_per_gpu", c.rent_known && c.buy_known ? num_or_null(c.break_even_hours) : json(nullptr)},
               {"break_even_months", c.rent_known && c.buy_known ? num_or_null(c.break_even_months) : json(nullptr)},
               {"run_hours_per_gpu", c.run_hours_per_gpu}};
  return j;
}

json search_json(const PlanInput& in, const SearchResult& s) {
  json fits = json::array();
  for (const auto& r : s.fits) {
    fits.push_back({{"layout", layout_json(r.layout)},
                    {"memory_gb", r.memory.total / 1e9},
                    {"headroom_gb", r.memory.headroom / 1e9},
                    {"step_s", r.time.step},
                    {"tokens_per_s", r.time.tokens_per_s},
                    {"mfu", r.time.mfu},
                    {"time_to_train_s", r.time.time_to_train_s},
                    {"gpu_hours", r.time.gpu_hours},
                    {"rent_total", r.cost.rent_known ? json(r.cost.rent_total) : json(nullptr)}});
  }
  json rejected = json::array();
  json counts = json::object();
  for (const auto& r : s.rejected) {
    rejected.push_back({{"layout", layout_json(r.layout)}, {"kind", r.kind}, {"reason", r.reason}});
    counts[r.kind] = counts.value(r.kind, 0) + 1;
  }
  json j = {{"gpus", in.cluster.gpus},
            {"considered", s.considered},
            {"fits", fits},
            {"rejected", rejected},
            {"rejected_counts", counts}};
  j["best"] = s.fits.empty() ? json(nullptr) : plan_json(in, s.fits.front());
  return j;
}

}  // namespace forge::plan
