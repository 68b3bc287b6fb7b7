#include "forge/plan/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "forge/plan/command.h"
#include "forge/plan/names.h"

namespace forge::plan {

namespace {

// Columns padded to their widest cell; `left[i]` aligns column i left (else right).
class Table {
 public:
  explicit Table(std::vector<bool> left) : left_(std::move(left)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void rule() { rows_.push_back({}); }
  std::string str(const std::string& indent = "  ") const {
    std::vector<size_t> w(left_.size(), 0);
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    size_t total = 0;
    for (size_t x : w) total += x + 2;
    std::ostringstream os;
    for (const auto& r : rows_) {
      if (r.empty()) {
        os << indent << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
        continue;
      }
      std::string line;
      for (size_t i = 0; i < r.size() && i < w.size(); ++i) {
        const std::string pad(w[i] - r[i].size(), ' ');
        line += i ? "  " : "";
        line += left_[i] ? r[i] + pad : pad + r[i];
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      os << indent << line << "\n";
    }
    return os.str();
  }

 private:
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

std::string pct(double v, int decimals = 1) { return fixed(100 * v, decimals) + "%"; }

// How the step's compute is priced: "efficiency profile H100 SXM (measured)" or "MFU 40%".
std::string efficiency_name(const PlanInput& in) {
  if (!in.profile) return "MFU " + pct(in.mfu, 0);
  return "efficiency profile " + in.profile->gpu + (in.profile->measured_on.empty() ? " (derived)" : " (measured)");
}
std::string money(double v) {
  if (!std::isfinite(v)) return "n/a";
  if (std::fabs(v) >= 1e4) return "$" + si(v, 3);
  if (std::fabs(v) >= 100) return "$" + with_commas(std::llround(v));
  return "$" + fixed(v, 2);
}
std::string shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

std::string format_plan(const PlanInput& in, const PlanResult& r) {
  const ModelSpec& m = in.model;
  const auto& mem = r.memory;
  const auto& t = r.time;
  const auto& c = r.cost;
  const Layout& l = r.layout;
  const BytesPerParam bp = bytes_per_param(in.setup.precision, in.setup.optimizer);
  const std::string prec = precision_name(in.setup.precision);
  std::ostringstream os;
  os << "forge plan: " << m.name << " (" << m.describe() << ")\n\n";

  // Model and FLOPs.
  const auto& p = r.params;
  os << "model\n";
  Table tm({true, true, true});
  tm.row({"parameters", with_commas(p.total),
          si(static_cast<double>(p.total)) + ": embedding " + si(static_cast<double>(p.embedding)) +
              (p.position ? ", positions " + si(static_cast<double>(p.position)) : "") + ", " + std::to_string(m.n_layer) +
              " blocks x " + si(static_cast<double>(p.block.total())) + ", final norm " +
              si(static_cast<double>(p.final_norm)) + (p.head ? ", head " + si(static_cast<double>(p.head)) : ", head tied")});
  if (m.lora_rank > 0)
    tm.row({"LoRA adapters", with_commas(lora_parameters(m)),
            "trained (rank " + std::to_string(m.lora_rank) + "); the base's " + si(static_cast<double>(p.total)) +
                " frozen: weights only, no gradients or optimizer state"});
  const double attn = 3 * static_cast<double>(m.n_layer) * r.flops.attention_forward;
  tm.row({"FLOPs per token", si(r.flops.model),
          "6 x " + si(static_cast<double>(p.matmul)) + " matmul weights = " + si(6.0 * static_cast<double>(p.matmul)) +
              ", attention 12*L*s*h = " + si(attn) + "  (6N = " + si(r.flops.six_n) + ")"});
  tm.row({"training", si(in.tokens) + " tokens",
          "= " + sci(r.total_flops) + " FLOPs; batch " + std::to_string(in.global_batch) + " x " + std::to_string(m.seq_len) +
              " = " + si(t.tokens_per_step) + " tokens per step, " + with_commas(t.steps) + " steps"});
  os << tm.str() << "\n";

  // Hardware.
  const auto& g = in.cluster.gpu;
  os << "hardware\n  " << in.cluster.gpus << " x " << g.name << " (" << fixed(g.memory_gb, 0) << " GB, "
     << (t.peak_flops < 10e12 ? fixed(t.peak_flops / 1e12, 3) : fixed(t.peak_flops / 1e12, 1)) << " TFLOP/s "
     << (in.setup.precision == Precision::fp8 ? "bf16 dense, " + fixed(g.peak_flops(Precision::fp8) / 1e12, 1) +
                                                    " fp8 for the blocks' linears"
                                              : std::string(prec) + " dense")
     << ")";
  if (!g.is_cpu) {
    os << ", " << in.cluster.gpus_per_node << " per node; " << in.cluster.intra_name << " " << fixed(in.cluster.intra_gbs, 0)
       << " GB/s, network " << fixed(in.cluster.inter_gbs, 0) << " GB/s per GPU (links at "
       << pct(in.cluster.link_efficiency, 0) << ")";
  }
  os << "\n  source: " << g.source << "\n\n";

  os << "layout\n  " << l.describe() << "; " << prec << ", " << optimizer_name(in.setup.optimizer) << ", "
     << efficiency_name(in) << "; activations: " << activation_model_name(in.setup.activations.model) << " model, "
     << attention_name(in.setup.activations.attention) << " attention\n\n";

  // Memory.
  const double dd = static_cast<double>(l.dp);
  // GB (1e9 bytes) for GPU-sized totals, MB below 2 GB.
  const bool mb = mem.total < 2e9;
  const std::string unit = mb ? "MB" : "GB";
  auto B = [&](double bytes, int decimals = 2) { return fixed(bytes / (mb ? 1e6 : 1e9), decimals); };
  os << "memory per GPU (stage " << mem.stage << " of " << l.pp << ", " << mem.layers_on_stage << " layers, "
     << with_commas(mem.params_on_gpu) << " parameters)\n";
  Table mt({true, true, true});
  mt.row({"", unit, ""});
  mt.row({"parameters", B(mem.params), prec + ", " + fixed(bp.param, 0) + " B/param" + (l.sharding().parameters() ? " / dp " + fixed(dd, 0) : "")});
  mt.row({"gradients", B(mem.grads),
          fixed(bp.grad, 0) + " B/param" + (l.sharding().gradients() ? " / dp " + fixed(dd, 0) : "") +
              (in.setup.activations.model == ActivationModel::forge && mem.grads < mem.params_on_gpu * bp.grad * 0.99
                   ? " (those alive at the peak)"
                   : "")});
  mt.row({"optimizer state", B(mem.optimizer),
          l.offload ? "offloaded: " + B(mem.host_bytes) + " " + unit + " in host memory"
                    : fixed(bp.optimizer, 0) + " B/param" + (l.sharding().optimizer_state() ? " / dp " + fixed(dd, 0) : "")});
  mt.row({"activations", B(mem.activations),
          std::to_string(mem.layers_on_stage) + " layers x " + std::to_string(mem.in_flight) +
              " micro-batch(es) in flight, checkpointing " + checkpointing_name(l.checkpointing)});
  mt.row({"transient", B(mem.transient), "dlogits or one recomputed layer, at the peak"});
  mt.row({"comm buffers", B(mem.comm_buffers), ""});
  mt.row({"allocator margin", B(mem.margin), pct(in.setup.margin, 0) + " of the above (fragmentation)"});
  mt.row({"runtime reserve", B(mem.reserve), "CUDA context, library workspaces"});
  mt.rule();
  mt.row({"total", B(mem.total),
          "of " + B(mem.capacity) + " -> " +
              (mem.fits ? "fits, " + B(mem.headroom) + " " + unit + " free" : "DOES NOT FIT, " + B(-mem.headroom) + " " + unit + " over")});
  os << mt.str();
  os << "  activations per layer per micro-batch: " << B(mem.layer_full, 3) << " " + unit + " without checkpointing";
  if (mem.layer_selective != mem.layer_full) os << ", " << B(mem.layer_selective, 3) << " " + unit + " selective";
  os << ", " << B(mem.layer_checkpointed, 3) << " " + unit + " with full checkpointing\n";
  os << "  activations of the stage: " << B(mem.stage_no_checkpointing) << " " << unit << " without checkpointing, "
     << B(mem.stage_full_checkpointing) << " " + unit + " with full checkpointing\n";
  os << "  peak: " << mem.peak_phase << "\n\n";

  // Time.
  os << "time per step\n";
  Table tt({true, true, true, true});
  tt.row({"", "s", "share", ""});
  auto line = [&](const std::string& name, double v, const std::string& note) {
    tt.row({name, fixed(v, v < 1 ? 4 : 3), pct(t.step > 0 ? v / t.step : 0), note});
  };
  line("compute", t.compute,
       (in.profile ? std::string("each kernel at the profile's rates") : "model FLOPs at MFU " + pct(in.mfu, 0)) + ", " +
           std::to_string(l.grad_accum) + " micro-batches");
  if (in.profile) {
    line("  GEMMs", t.gemm, "linears and head, forward and backward");
    line("  attention", t.attention, "the attention core");
    line("  memory-bound", t.memory_bound, "norms, residuals, activations, loss");
  }
  if (t.recompute > 0) line("recomputation", t.recompute, "checkpointing " + std::string(checkpointing_name(l.checkpointing)));
  if (l.tp > 1) line("tensor-parallel", t.tp_comm, "all-reduces over " + t.tp_link.name);
  if (l.cp > 1)
    line(l.cp_kind == parallel::ContextKind::ring ? "context ring (exposed)" : "context all-to-all", t.cp_comm,
         (l.cp_kind == parallel::ContextKind::ring ? "K/V blocks over " : "all-to-alls over ") + t.cp_link.name);
  if (l.pp > 1) {
    line("pipeline send/recv", t.pp_p2p, t.pp_link.name);
    const double share = l.schedule == Schedule::zb_h1         ? t.zb_h1_share
                         : l.schedule == Schedule::interleaved ? 1.0 / static_cast<double>(l.virtual_stages)
                                                               : 1.0;
    const std::string formula = l.schedule == Schedule::zb_h1         ? "(p-1)/(m+p-1) x " + fixed(t.zb_h1_share, 2) + " = "
                                : l.schedule == Schedule::interleaved ? "(p-1)/(m+p-1)/v = "
                                                                      : "(p-1)/(m+p-1) = ";
    line("pipeline bubble", t.bubble, formula + pct(share * bubble_fraction(l.pp, l.grad_accum)));
  }
  if (l.dp > 1)
    line("data-parallel", t.dp_exposed,
         "exposed of " + fixed(t.dp_comm, 3) + " s over " + t.dp_link.name + " (ZeRO-" + std::to_string(l.zero) + ")");
  line("optimizer step", t.optimizer + t.offload, l.offload ? "on the host (offload)" : "memory-bound");
  tt.rule();
  line("step", t.step, "");
  os << tt.str();
  os << "  throughput  " << si(t.tokens_per_s) << " tokens/s (" << si(t.tokens_per_s / static_cast<double>(l.gpus()))
     << " per GPU), effective MFU " << pct(t.mfu) << "\n";
  os << "  to train    " << with_commas(t.steps) << " steps: " << duration(t.time_to_train_s) << ", "
     << si(t.gpu_hours) << " GPU-hours (compute alone" << (in.profile ? std::string() : " at MFU " + pct(in.mfu, 0)) << ": "
     << si(t.ideal_gpu_hours)
     << " GPU-hours)\n\n";

  // Cost.
  os << "cost\n";
  if (c.rent_known) {
    os << "  rent   " << money(c.rent_per_hour) << " per GPU-hour -> " << money(c.rent_total) << "\n";
  } else {
    os << "  rent   no price for the " << g.name << " in the catalogue: give --price-hour\n";
  }
  if (c.buy_known) {
    os << "  buy    " << l.gpus() << " x " << money(c.capex_per_gpu) << " = " << money(c.capex_total) << "; energy "
       << fixed(c.power_w / 1000, 2) << " kW per GPU x PUE " << fixed(in.cost.pue, 2) << " x " << money(in.cost.electricity)
       << "/kWh = " << money(c.energy_per_gpu_hour) << " per GPU-hour (this run: " << si(c.energy_kwh) << " kWh, "
       << money(c.energy_cost) << ")\n";
    os << "         over " << fixed(in.cost.years, 0) << " years at " << pct(in.cost.utilisation, 0)
       << " use: " << money(c.owned_per_gpu_hour) << " per GPU-hour -> this run's share " << money(c.buy_run_cost) << "\n";
    if (c.rent_known) {
      if (std::isfinite(c.break_even_hours)) {
        os << "  break-even: buying pays after " << si(c.break_even_hours) << " hours of use per GPU ("
           << fixed(c.break_even_months, 1) << " months at " << pct(in.cost.utilisation, 0) << " use); this run uses "
           << si(c.run_hours_per_gpu) << " hours per GPU -> "
           << (c.run_hours_per_gpu >= c.break_even_hours ? "buying is cheaper for this run alone"
                                                          : "renting is cheaper for this run alone")
           << "\n";
      } else {
        os << "  break-even: never (renting costs no more than the power)\n";
      }
    }
  } else {
    os << "  buy    no purchase price for the " << g.name << " in the catalogue: give --price-gpu or --price-server\n";
  }
  return os.str();
}

std::string format_search(const PlanInput& in, const SearchResult& s, size_t top, bool all_rejected) {
  std::ostringstream os;
  const ModelSpec& m = in.model;
  os << "forge plan --search: " << m.name << " (" << m.describe() << ")\n"
     << "  " << si(in.tokens) << " tokens, batch " << in.global_batch << " x " << m.seq_len << ", "
     << precision_name(in.setup.precision) << " " << optimizer_name(in.setup.optimizer) << ", " << efficiency_name(in)
     << ", on " << in.cluster.gpus << " x " << in.cluster.gpu.name << " (" << fixed(in.cluster.gpu.memory_gb, 0)
     << " GB), " << in.cluster.gpus_per_node << " per node\n"
     << "  " << s.considered << " layouts considered: " << s.fits.size() << " fit, " << s.rejected.size()
     << " rejected\n\n";
  if (!s.fits.empty()) {
    // (dp "4h": reduced within each node first, dist.dp_reduce = "hierarchical")
    Table t({false, false, false, false, false, true, false, false, false, false, false, false, false});
    t.row({"#", "dp", "tp", "pp", "mb x acc", "zero/ckpt", "mem GB", "free", "step s", "tok/s", "MFU", "days", "GPU-h"});
    for (size_t i = 0; i < s.fits.size() && i < top; ++i) {
      const auto& r = s.fits[i];
      const Layout& l = r.layout;
      std::string zc = "ZeRO-" + std::to_string(l.zero) + (l.offload ? "+off" : "") + " " + checkpointing_name(l.checkpointing);
      const bool hier = l.dp_reduce == parallel::DpReduce::hierarchical && l.dp > 1;
      t.row({std::to_string(i + 1), std::to_string(l.dp) + (hier ? "h" : ""), std::to_string(l.tp) + (l.sequence_parallel && l.tp > 1 ? "+sp" : ""),
             std::to_string(l.pp), std::to_string(l.micro_batch) + " x " + std::to_string(l.grad_accum), zc,
             gib(r.memory.total, 1), gib(r.memory.headroom, 1), fixed(r.time.step, 2), si(r.time.tokens_per_s),
             pct(r.time.mfu), fixed(r.time.time_to_train_s / 86400, 1), si(r.time.gpu_hours)});
    }
    os << "fastest layouts that fit (of " << s.fits.size() << ")"
       << (in.cluster.gpus > in.cluster.gpus_per_node ? "; dp \"h\": reduced within each node first (dist.dp_reduce)" : "")
       << (in.layout.grad_compression == parallel::GradCompression::fp8 ? "; gradients reduced in FP8 (--grad-compression)"
           : in.layout.grad_compression == parallel::GradCompression::powersgd
               ? "; DDP rows' gradients by PowerSGD rank " + std::to_string(in.layout.powersgd_rank) + " (--grad-compression)"
               : std::string())
       << "\n" << t.str();
    const auto& best = s.fits.front();
    os << "\nbest: " << best.layout.describe() << "\n  " << duration(best.time.time_to_train_s) << ", "
       << si(best.time.gpu_hours) << " GPU-hours, " << gib(best.memory.total, 1) << " of "
       << gib(best.memory.capacity, 1) << " GB per GPU";
    if (best.cost.rent_known) os << ", " << money(best.cost.rent_total) << " rented";
    if (best.cost.buy_known) os << "; buying " << money(best.cost.capex_total) << " up front";
    os << "\n  (forge plan with these flags, without --search, prints its full breakdown)\n";
    const TrainCommand cmd = train_command(in, best.layout);
    if (cmd.unsupported.empty()) {
      os << "  run it:\n    " << cmd.command << "\n";
      if (!cmd.fill_in.empty()) os << "  with\n    " << cmd.fill_in << "\n";
      os << "\n";
    } else {
      os << "  forge train does not run this layout yet (" << cmd.unsupported << "); its command once it does:\n    "
         << cmd.command << "\n\n";
    }
  } else {
    os << "no layout fits.\n\n";
  }
  if (!s.rejected.empty()) {
    std::map<std::string, std::vector<const Rejected*>> by_kind;
    for (const auto& r : s.rejected) by_kind[r.kind].push_back(&r);
    os << "rejected\n";
    for (const auto& [kind, rs] : by_kind) {
      os << "  " << kind << ": " << rs.size() << "\n";
      // The distinct reasons; memory ones (each with its own numbers) closest miss first.
      std::vector<const Rejected*> shown = rs;
      if (kind == "memory") {
        std::stable_sort(shown.begin(), shown.end(),
                         [](const Rejected* a, const Rejected* b) { return a->needs_bytes < b->needs_bytes; });
      }
      std::vector<std::string> seen;
      size_t n = 0;
      for (const Rejected* r : shown) {
        if (!all_rejected) {
          if (kind != "memory" && std::find(seen.begin(), seen.end(), r->reason) != seen.end()) continue;
          if (n == 4) break;
        }
        seen.push_back(r->reason);
        os << "    " << r->layout.describe() << ": " << r->reason << "\n";
        ++n;
      }
      if (!all_rejected && rs.size() > n) os << "    ... (" << rs.size() - n << " more; --all lists every one)\n";
    }
  }
  return os.str();
}

std::string format_summary(const ModelSpec& m, const Summary& s) {
  std::ostringstream os;
  os << "summary of " << m.name << " (" << m.describe() << "), micro-batch " << s.batch << "\n";
  Table t({true, true, true, false, false, true});
  t.row({"module", "type", "output shape", "params", "forward FLOPs", "note"});
  t.rule();
  for (const auto& r : s.rows) {
    t.row({std::string(2 * r.depth, ' ') + r.name, r.type, shape(r.shape), r.params ? with_commas(r.params) : "-",
           r.flops > 0 ? si(r.flops) : "-", r.note});
  }
  t.rule();
  t.row({"total", "", "", with_commas(s.total_params), si(s.total_flops), "forward; training = 3x"});
  os << t.str();
  os << "  FLOPs count matmuls and attention (2 per multiply-add); norms and elementwise ops are not counted\n";
  return os.str();
}

std::string format_gpu_catalog() {
  Table t({true, false, false, false, false, false, false, false, false, true});
  t.row({"name", "mem GB", "GB/s", "fp32", "tf32", "bf16", "fp8", "link GB/s", "W", "aliases"});
  auto tf = [](double v) { return v > 0 ? fixed(v, v < 100 ? 1 : 0) : std::string("-"); };
  for (const auto& g : gpu_catalog()) {
    std::string aliases;
    for (const auto& a : g.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    t.row({g.name, fixed(g.memory_gb, 0), fixed(g.memory_bw_gbs, 0), tf(g.fp32_tflops), tf(g.tf32_tflops),
           tf(g.bf16_tflops > 0 ? g.bf16_tflops : g.fp16_tflops) + (g.bf16_tflops > 0 ? "" : " (fp16)"), tf(g.fp8_tflops),
           g.nvlink_gbs > 0 ? fixed(g.nvlink_gbs, 0) : "PCIe " + fixed(g.pcie_gbs, 0), fixed(g.tdp_w, 0), aliases});
  }
  std::ostringstream os;
  os << "GPU catalogue (dense TFLOP/s; links per GPU per direction)\n" << t.str();
  os << "  cpu: this machine (RAM; f32 peak measured, or --peak-tflops)\n\nsources\n";
  for (const auto& g : gpu_catalog()) os << "  " << g.name << ": " << g.source << "\n";
  os << "\nefficiency profiles (forge plan's default; Note [efficiency profiles]: GEMM bf16 sustained, attention at "
        "2048 x 128 fwd/bwd, copies)\n";
  for (const auto& p : shipped_profiles()) {
    const AttentionRate a = attention_rate(p, 2048, 128);
    os << "  " << p.gpu << ": " << fixed(p.gemm.at(Precision::bf16).sustained_tflops, 0) << " TFLOP/s, "
       << fixed(a.fwd / 1e12, 0) << "/" << fixed(a.bwd / 1e12, 0) << " TFLOP/s, " << fixed(p.memory_gbs, 0) << " GB/s; "
       << p.source << "\n";
  }
  return os.str();
}

std::string format_presets() {
  Table t({true, true, false, true});
  t.row({"preset", "shape", "parameters", "aliases"});
  for (const auto& p : presets()) {
    std::string aliases;
    for (const auto& a : p.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    t.row({p.name, p.spec.describe(), with_commas(count_parameters(p.spec).total), aliases});
  }
  std::ostringstream os;
  os << "model presets\n" << t.str() << "\nsources\n";
  std::vector<std::string> seen;
  for (const auto& p : presets()) {
    if (std::find(seen.begin(), seen.end(), p.source) != seen.end()) continue;
    seen.push_back(p.source);
    os << "  " << p.source << "\n";
  }
  return os.str();
}

}  // namespace forge::plan
