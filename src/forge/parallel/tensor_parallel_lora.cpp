// LoRA on tensor-parallel linears: Note [tensor-parallel LoRA] in tensor_parallel_lora.h.
#include "forge/parallel/tensor_parallel_lora.h"

#include <typeinfo>
#include <utility>

#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/dropout.h"
#include "forge/ops/fp8.h"
#include "forge/ops/matmul.h"

namespace forge::parallel::tp {

namespace {
ProcessGroupPtr group_of(const nn::Linear& base) {
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(&base)) return c->group;
  if (const auto* kv = dynamic_cast<const ReplicatedKVLinear*>(&base)) return kv->group;
  FORGE_THROW("ColumnParallelLora: the base is a ", typeid(base).name(),
              ", not a ColumnParallelLinear or ReplicatedKVLinear");
}
bool sequence_parallel_of(const nn::Linear& base) {
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(&base)) return c->sequence_parallel;
  return dynamic_cast<const ReplicatedKVLinear&>(base).sequence_parallel;
}
}  // namespace

ColumnParallelLora::ColumnParallelLora(std::shared_ptr<nn::Linear> b, const nn::LoraOptions& o)
    : nn::LoraLinear(std::move(b), o), group(group_of(*base)), sequence_parallel(sequence_parallel_of(*base)) {
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(base.get()))
    FORGE_CHECK(!c->gather_output, "ColumnParallelLora: a column-parallel linear that gathers its output has no "
                "LoRA adapter yet; adapt the linears of the model's blocks");
}

Tensor ColumnParallelLora::forward(const Tensor& x) const {
  if (!attached()) return base->forward(x);
  // Without dropout in training, the base's product and the adapter's in one node on the whole
  // input from the base's region entry (Note [fused LoRA linear] in ops/matmul.cpp; the base's
  // weight gradient is not wanted, so nothing waits for a deferred queue); with it, or with an FP8
  // base (its forward casts through the recipe, Note [FP8 under tensor parallelism]), the base's
  // forward and the composed branch on the same entry (Note [one collective per input]).
  const bool fp8_base = base->fp8 && fp8::training_recipe().has_value();
  if (!(dropout > 0 && is_training()) && !fp8_base) {
    const Tensor in = enter_column_region(x, group, sequence_parallel).input;
    return ops::lora_linear(in, base->weight, base->bias, lora_A->weight, lora_B->weight, scale);
  }
  const Tensor y = base->forward(x);
  const Tensor in = enter_column_region(x, group, sequence_parallel).input;
  const Tensor d = ops::dropout(in, dropout, is_training());
  return ops::add(y, ops::mul(ops::linear(ops::linear(d, lora_A->weight), lora_B->weight), scale));
}

RowParallelLora::RowParallelLora(std::shared_ptr<RowParallelLinear> b, const nn::LoraOptions& o)
    : nn::LoraLinear(std::move(b), o) {}

Tensor RowParallelLora::forward(const Tensor& x) const {
  const auto& row = static_cast<const RowParallelLinear&>(*base);
  if (!attached()) return row.forward(x);
  const bool fp8_base = row.fp8 && fp8::training_recipe().has_value();
  return row.forward_partial(x, [this, &row, fp8_base](const Tensor& xs) {
    if (!(dropout > 0 && is_training()) && !fp8_base)  // Note [fused LoRA linear]
      return ops::lora_linear(xs, row.weight, Tensor(), lora_A->weight, lora_B->weight, scale);
    // (an FP8 base: its shard's product through the recipe, amaxes over the group)
    const Tensor d = ops::dropout(xs, dropout, is_training());
    return ops::add(row.partial_product(xs),
                    ops::mul(ops::linear(ops::linear(d, lora_A->weight), lora_B->weight), scale));
  });
}

std::shared_ptr<nn::LoraLinear> lora_wrap(std::shared_ptr<nn::Linear> base, const nn::LoraOptions& o) {
  FORGE_CHECK(base != nullptr, "tp::lora_wrap: no linear to adapt");
  if (auto row = std::dynamic_pointer_cast<RowParallelLinear>(base)) return std::make_shared<RowParallelLora>(row, o);
  if (dynamic_cast<const ColumnParallelLinear*>(base.get()) || dynamic_cast<const ReplicatedKVLinear*>(base.get()))
    return std::make_shared<ColumnParallelLora>(std::move(base), o);
  const nn::Linear& plain = *base;
  FORGE_CHECK(typeid(plain) == typeid(nn::Linear), "LoRA: no adapter for a linear of kind ", typeid(plain).name(),
              "; LoRA adapts plain, column-parallel and row-parallel linears");
  return std::make_shared<nn::LoraLinear>(std::move(base), o);
}

}  // namespace forge::parallel::tp
