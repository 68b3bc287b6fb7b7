#pragma once
// Learning-rate schedules: linear warmup, then cosine or linear decay to a floor, or constant.
//
// With peak lr, floor min_lr, W = warmup_steps, T = total_steps, and s the 0-based index
// of the optimizer step about to run (the number of steps already taken):
//   s < W:            lr * (s + 1) / W                  (reaches lr at s = W - 1)
//   constant:         lr                                 (s >= W)
//   W <= s <= T:      r = (s - W) / (T - W)              (0 at the end of warmup, 1 at T)
//     cosine          min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2
//     linear          lr - (lr - min_lr) * r
//   s > T:            min_lr                             (and at s >= W when T == W)
// T counts warmup steps too (nanoGPT's lr_decay_iters, not a length after warmup).
//
//   LRSchedule sched{.kind = ScheduleKind::cosine, .lr = 6e-4, .min_lr = 6e-5,
//                    .warmup_steps = 700, .total_steps = 19073};
//   sched.apply(opt, opt.step_count());  // before opt.step(): every group's lr
//
// Checked (forge::Error "LRSchedule: ..."): lr and min_lr finite with 0 <= min_lr <= lr,
// warmup_steps >= 0, total_steps >= warmup_steps (decaying kinds), step >= 0.
#include <cstdint>

namespace forge::optim {

class Optimizer;

enum class ScheduleKind { constant, cosine, linear };

struct LRSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double lr = 1e-3;      // the peak, reached at the end of warmup
  double min_lr = 0.0;   // the floor the decay ends at (unused by constant)
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // the step the decay reaches min_lr at (unused by constant)

  // The learning rate for 0-based step `step`; a pure function of the fields.
  double lr_at(int64_t step) const;
  // Sets every param group's lr to lr_at(step).
  void apply(Optimizer& opt, int64_t step) const;
  // Throws forge::Error if the fields are inconsistent (lr_at and apply call it).
  void validate() const;
};

const char* schedule_kind_name(ScheduleKind kind);

}  // namespace forge::optim
