// The forge train command of a planned layout (contract in command.h).
#include "forge/plan/command.h"

#include <cmath>
#include <sstream>

namespace forge::plan {

TrainCommand train_command(const PlanInput& in, const Layout& l) {
  const ModelSpec& m = in.model;
  const int64_t gpus = l.dp * l.tp * l.pp;
  const int64_t per_node = in.cluster.gpus_per_node;
  std::ostringstream os;
  if (gpus <= per_node) {
    os << "forge launch --nproc-per-node " << gpus << " -- forge train";
  } else {
    os << "srun -N " << (gpus + per_node - 1) / per_node << " --ntasks-per-node " << per_node << " forge train";
  }
  const bool config = m.name.size() > 5 && m.name.substr(m.name.size() - 5) == ".toml";
  if (config) {
    os << " " << m.name;
  } else {
    const bool gpt = m.arch == nn::Arch::gpt;
    os << " configs/" << (gpt ? "gpt2-124m" : "llama-0.85b") << ".toml --model.type=" << (gpt ? "gpt" : "llama")
       << " --model.n_layer=" << m.n_layer << " --model.n_head=" << m.n_head << " --model."
       << (gpt ? "n_embd" : "dim") << "=" << m.d_model;
    if (!gpt) os << " --model.n_kv_head=" << m.n_kv_head << " --model.ffn_hidden=" << m.ffn_hidden;
    os << " --model.vocab_size=" << m.vocab_size << " --model.block_size=" << m.block_size;
    if (gpt) os << " --model.bias=" << (m.bias ? "true" : "false");
  }
  TrainCommand c;
  if (!in.data_given) {  // the config's data (random tokens, for the model's shape) is not the run's
    os << " --data.source=files --data.files=CORPUS --data.tokenizer=TOKENIZER";
    c.fill_in = "CORPUS = your training data: text files, a directory, .jsonl or token shards (docs/train.md, "
                "[data]);\n    TOKENIZER = a tokenizer file of " + std::to_string(m.vocab_size) +
                " tokens: a Hugging Face tokenizer.json, tiktoken or sentencepiece (docs/tokenizers.md)";
  }
  const int64_t tokens_per_step = l.global_batch() * m.seq_len;
  const int64_t steps = tokens_per_step > 0 && in.tokens > 0
                            ? static_cast<int64_t>(std::ceil(in.tokens / static_cast<double>(tokens_per_step)))
                            : 0;
  if (steps > 0) os << " --train.steps=" << steps;
  os << " --train.seq_len=" << m.seq_len << " --train.batch_size=" << l.global_batch()
     << " --train.grad_accum=" << l.grad_accum;
  if (l.tp > 1) os << " --dist.tp=" << l.tp << (l.sequence_parallel ? " --dist.sequence_parallel=true" : "");
  if (l.pp > 1) os << " --dist.pp=" << l.pp << " --dist.pp_schedule=" << schedule_name(l.schedule);
  if (l.cp > 1)
    os << " --dist.cp=" << l.cp << (l.cp_kind == parallel::ContextKind::ulysses ? " --dist.cp_kind=ulysses" : "");
  if (l.pp > 1 && l.schedule == parallel::PipelineSchedule::interleaved) os << " --dist.pp_virtual_stages=" << l.virtual_stages;
  if (l.sharding().optimizer_state()) os << " --dist.zero_stage=" << l.zero;
  if (l.offload) os << " --dist.offload_optimizer=true";
  if (l.dp_reduce == parallel::DpReduce::hierarchical && l.dp > 1) os << " --dist.dp_reduce=hierarchical";
  if (l.grad_compression != parallel::GradCompression::none && l.dp > 1)
    os << " --dist.grad_compression=" << parallel::grad_compression_name(l.grad_compression)
       << (l.grad_compression == parallel::GradCompression::powersgd ? " --dist.powersgd_rank=" + std::to_string(l.powersgd_rank)
                                                                      : std::string());
  if (l.checkpointing == Checkpointing::full) os << " --model.checkpoint_activations=true";
  const char* dtype = in.setup.precision == Precision::fp16                                           ? "f16"
                      : in.setup.precision == Precision::bf16 || in.setup.precision == Precision::fp8 ? "bf16"
                                                                                                     : "f32";
  os << " --run.dtype=" << dtype;
  if (in.setup.precision == Precision::fp8) os << " --run.fp8=tensorwise";
  c.command = os.str();
  // What forge train refuses today (run/config_checks.cpp), said rather than printed as if it ran.
  if (l.sharding().parameters() && (l.tp > 1 || l.pp > 1)) c.unsupported = "ZeRO-3 with tensor or pipeline parallelism";
  else if (l.offload && (l.tp > 1 || l.pp > 1)) c.unsupported = "an offloaded optimizer with tensor or pipeline parallelism";
  else if (l.checkpointing == Checkpointing::selective) c.unsupported = "selective activation checkpointing (forge checkpoints whole blocks)";
  else if (in.setup.precision == Precision::tf32)
    c.unsupported = std::string(precision_name(in.setup.precision)) + " training";
  return c;
}

}  // namespace forge::plan
