#include "forge/parallel/layout.h"

#include <sstream>
#include <string>

#include "forge/core/error.h"

namespace forge::parallel {

const char* checkpointing_name(Checkpointing c) {
  return c == Checkpointing::none ? "none" : c == Checkpointing::selective ? "selective" : "full";
}

const char* grad_compression_name(GradCompression g) {
  return g == GradCompression::fp8 ? "fp8" : g == GradCompression::powersgd ? "powersgd" : "none";
}

GradCompression grad_compression_from_name(const std::string& name) {
  if (name == "none") return GradCompression::none;
  if (name == "fp8") return GradCompression::fp8;
  if (name == "powersgd") return GradCompression::powersgd;
  FORGE_THROW("dist.grad_compression = '", name, "' is unknown; use \"none\", \"fp8\" or \"powersgd\"");
}

const char* schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::zb_h1: return "zb-h1";
    case PipelineSchedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string Layout::describe() const {
  std::ostringstream os;
  os << "dp " << dp << ", tp " << tp << (sequence_parallel && tp > 1 ? " (+sp)" : "") << ", pp " << pp;
  if (cp > 1) os << ", cp " << cp << " (" << (cp_kind == ContextKind::ring ? "ring" : "ulysses") << ")";
  if (pp > 1 && schedule == PipelineSchedule::gpipe) os << " (gpipe)";
  os << ", micro-batch " << micro_batch << " x " << grad_accum << ", ZeRO-" << zero << (offload ? " + offload" : "")
     << ", checkpointing " << checkpointing_name(checkpointing);
  if (dp_reduce == DpReduce::hierarchical && dp * cp > 1)
    os << ", dp reduced within " << (node_size > 0 ? "nodes of " + std::to_string(node_size) + " ranks" : "each host")
       << " first";
  if (link_gbps > 0 && dp * cp > 1) os << ", simulated " << link_gbps << " Gb/s between nodes";
  if (grad_compression == GradCompression::fp8 && dp * cp > 1) os << ", gradients reduced in FP8";
  if (grad_compression == GradCompression::powersgd && dp * cp > 1) os << ", PowerSGD rank " << powersgd_rank;
  return os.str();
}

}  // namespace forge::parallel
