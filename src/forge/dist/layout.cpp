#include "forge/dist/layout.h"

#include <sstream>

namespace forge::dist {

const char* checkpointing_name(Checkpointing c) {
  return c == Checkpointing::none ? "none" : c == Checkpointing::selective ? "selective" : "full";
}

const char* schedule_name(PipelineSchedule s) { return s == PipelineSchedule::one_f_one_b ? "1f1b" : "gpipe"; }

std::string Layout::describe() const {
  std::ostringstream os;
  os << "dp " << dp << ", tp " << tp << (sequence_parallel && tp > 1 ? " (+sp)" : "") << ", pp " << pp;
  if (pp > 1 && schedule == PipelineSchedule::gpipe) os << " (gpipe)";
  os << ", micro-batch " << micro_batch << " x " << grad_accum << ", ZeRO-" << zero << (offload ? " + offload" : "")
     << ", checkpointing " << checkpointing_name(checkpointing);
  return os.str();
}

}  // namespace forge::dist
