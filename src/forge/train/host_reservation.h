#pragma once
// Note [reserving segments ahead] (core/block_pool.cpp): the pinned host memory of the checkpoint
// snapshots, page-locked on a thread of its own while the first steps train, so the first
// checkpoint does not stall for it (24.8 s for a 3.6B model's 50 GB on an H100 host).
//
//   HostReservation r;
//   r.start(device, strategy->checkpoint_host_bytes());   // after the first step
//   ... at the first checkpoint: log << r.wait();          // the rest of it, if any, then a line
//
// Leaving the scope stops it after the segment in hand.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "forge/core/device.h"

namespace forge::train {

class HostReservation {
 public:
  HostReservation() = default;
  HostReservation(const HostReservation&) = delete;
  HostReservation& operator=(const HostReservation&) = delete;
  ~HostReservation();
  bool started() const { return started_; }
  // Starts reserving `bytes` (in the order the snapshot copies them) for `device`'s copies;
  // returns their total (0: nothing to do, no thread).
  uint64_t start(Device device, std::vector<size_t> bytes);
  // Waits for the reservation; the first time, a line for the log (empty otherwise).
  std::string wait();

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  uint64_t requested_ = 0, reserved_ = 0;
  double seconds_ = 0.0;
  std::string error_;
};

}  // namespace forge::train
