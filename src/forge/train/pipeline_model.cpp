// The model of a pipeline-parallel run (contract in pipeline_model.h).
#include "forge/train/pipeline_model.h"

#include <ostream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/creation.h"
#include "forge/parallel/pipeline_schedule.h"
#include "forge/plan/model_spec.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/run_model_spec.h"

namespace forge::train {

void stage_model_for_layout(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                            std::ostream& log) {
  if (layout.pp == 1) return;
  FORGE_CHECK(cfg.is_language_model(), "dist.pp = ", layout.pp, " splits a GPT or LLaMA; model.type = '",
              cfg.model.type, "' trains with dist.pp = 1");
  auto lm = std::dynamic_pointer_cast<nn::CausalLM>(model.module);
  FORGE_CHECK(lm != nullptr, "pipeline parallelism: the model is not a CausalLM");
  auto st = std::make_shared<Model::Stage>();
  st->index = mesh.pp_rank();
  st->stages = static_cast<int>(layout.pp);
  // Interleaved: v chunks per rank, chunk c the virtual stage c P + s of v P.
  const int v = static_cast<int>(layout.virtual_stages);
  const int virtual_stages = st->stages * v;
  // The blocks of each (virtual) stage: dist.pp_layers when given (only without virtual stages),
  // else balanced by forge plan's cost per block and head (Note [balanced pipeline stages]).
  const std::vector<int64_t> given =
      !cfg.dist.pp_layers.empty() ? cfg.dist.pp_layers : plan::stage_layers(model_spec_of(cfg), virtual_stages);
  for (int c = 0; c < v; ++c)
    st->chunks.push_back(parallel::pp::stage_blocks(lm->num_blocks(), virtual_stages, c * st->stages + st->index, given));
  std::tie(st->begin, st->end) = st->chunks.front();
  const bool tied = nn::transformer_shape(cfg.model).tied_head();
  // Who holds what: a block's tensors its stage; the others (embeddings, final norm, head) the
  // first stage, except the final norm and head, the last; GPT's wte both (the tied head).
  int64_t held_count = 0;
  const int64_t whole_count = model.module->num_parameters();
  for (const auto& [name, t] : model.module->state_dict()) {
    st->whole_shapes[name] = t.shape();
    const int block = lm->block_of_param(name);
    int owner = 0;
    bool last_too = false;
    if (block >= 0) {
      for (int j = 0; j < virtual_stages; ++j) {
        const auto [b, e] = parallel::pp::stage_blocks(lm->num_blocks(), virtual_stages, j, given);
        if (block >= b && block < e) owner = j % st->stages;
      }
    } else {
      const bool input_side = name.find("wte.") != std::string::npos || name.find("wpe.") != std::string::npos ||
                              name.find("embed_tokens.") != std::string::npos;
      owner = input_side ? 0 : st->stages - 1;
      if (tied && name.find("wte.") != std::string::npos) {
        last_too = true;
        st->tied = name;
      }
    }
    st->owner[name] = owner;
    if (owner == st->index || (last_too && st->last())) st->held[name] = true;
  }
  // The tensors this stage does not hold: emptied (their memory freed before the move to the
  // device; the module keeps the names and ranks, the whole shapes live in the stage).
  {
    NoGradGuard no_grad;
    for (const auto& [name, t] : model.module->state_dict()) {
      if (st->held.count(name)) {
        held_count += t.requires_grad() ? t.numel() : 0;
        continue;
      }
      // (Empty, but of the same rank: a parameter's dimensions decide its optimizer group, and a
      // one-process checkpoint's optimizer state is stored by slot in that order.)
      t.set_data(empty(Shape(static_cast<size_t>(t.dim()), 0), {.dtype = t.dtype(), .device = t.device()}));
    }
  }
  model.stage = st;
  log << "pipeline parallel: " << layout.pp << " stages (" << parallel::schedule_name(layout.schedule) << "), stage "
      << st->index << " runs blocks [" << st->begin << ", " << st->end << ")";
  for (size_t c = 1; c < st->chunks.size(); ++c) log << ", [" << st->chunks[c].first << ", " << st->chunks[c].second << ")";
  log << (st->first() ? " and the embeddings" : "")
      << (st->last() ? " and the head" : "") << "; " << telemetry::format_count(static_cast<double>(held_count))
      << " of the " << telemetry::format_count(static_cast<double>(whole_count)) << " parameters\n";
}

}  // namespace forge::train
