// Learning-rate schedules. See schedule.h for the formulas: warmup lr * (s + 1) / W, then
// cosine min_lr + (lr - min_lr) (1 + cos(pi r)) / 2 or linear lr - (lr - min_lr) r with
// r = (s - W) / (T - W), min_lr after T; or constant lr after warmup.
#include "forge/optim/schedule.h"

#include <cmath>
#include <numbers>

#include "forge/core/error.h"
#include "forge/optim/optimizer.h"

namespace forge::optim {

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::constant: return "constant";
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::linear: return "linear";
  }
  return "unknown";
}

void LRSchedule::validate() const {
  FORGE_CHECK(std::isfinite(lr) && lr >= 0, "LRSchedule: lr must be finite and >= 0, got ", lr);
  FORGE_CHECK(warmup_steps >= 0, "LRSchedule: warmup_steps must be >= 0, got ", warmup_steps);
  if (kind == ScheduleKind::constant) return;
  FORGE_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "LRSchedule (", schedule_kind_name(kind),
              "): min_lr must be in [0, lr] = [0, ", lr, "], got ", min_lr);
  FORGE_CHECK(total_steps >= warmup_steps, "LRSchedule (", schedule_kind_name(kind), "): total_steps (", total_steps,
              ") must be >= warmup_steps (", warmup_steps, "); total_steps counts the warmup steps too");
}

double LRSchedule::lr_at(int64_t step) const {
  validate();
  FORGE_CHECK(step >= 0, "LRSchedule: step must be >= 0, got ", step);
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == ScheduleKind::constant) return lr;
  if (step >= total_steps) return min_lr;
  const double r = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  if (kind == ScheduleKind::cosine) return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * r));
  return lr - (lr - min_lr) * r;
}

void LRSchedule::apply(Optimizer& opt, int64_t step) const {
  const double value = lr_at(step);
  for (ParamGroup& g : opt.param_groups()) g.lr = value;
}

}  // namespace forge::optim
