#pragma once
// Sharding: what the data-parallel group shards (ZeRO, Rajbhandari et al. 2020), asked by what it
// means, never by comparing a stage's number. The config's dist.zero_stage = 0..3 is
// Sharding::from_stage; the number survives only in the log, the checkpoint's record and `forge plan`'s
// tables.
//
//   stage   name     optimizer_state()  gradients()  parameters()
//   0       DDP      -                  -            -             every rank updates everything
//   1       ZeRO-1   yes                -            -             each rank updates its slice
//   2       ZeRO-2   yes                yes          -             gradients reduce-scattered into it
//   3       ZeRO-3   yes                yes          yes           block parameters gathered around use
#include <string>

namespace forge::parallel {

class Sharding {
 public:
  constexpr Sharding() = default;  // DDP
  static constexpr Sharding ddp() { return Sharding(0); }
  static constexpr Sharding zero1() { return Sharding(1); }
  static constexpr Sharding zero2() { return Sharding(2); }
  static constexpr Sharding zero3() { return Sharding(3); }
  // dist.zero_stage's value; anything but 0..3 is a forge::Error naming `what` and the choices.
  static Sharding from_stage(long long stage, const std::string& what = "dist.zero_stage");

  // Each rank keeps the optimizer state (and the f32 master) of its slice only, and updates it.
  constexpr bool optimizer_state() const { return stage_ >= 1; }
  // Gradients are reduce-scattered into the owned slice at every micro-step (no full gradient kept).
  constexpr bool gradients() const { return stage_ >= 2; }
  // The blocks' parameters live as slices, gathered for each block's forward and backward.
  constexpr bool parameters() const { return stage_ >= 3; }

  constexpr int stage() const { return stage_; }  // for records and logs only
  std::string name() const;                        // "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"
  friend constexpr bool operator==(Sharding a, Sharding b) { return a.stage_ == b.stage_; }

 private:
  constexpr explicit Sharding(int stage) : stage_(stage) {}
  int stage_ = 0;
};

}  // namespace forge::parallel
