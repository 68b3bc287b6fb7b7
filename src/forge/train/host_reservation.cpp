// Note [reserving segments ahead] (host_reservation.h, core/block_pool.cpp).
#include "forge/train/host_reservation.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <utility>

#include "forge/ops/copy.h"
#include "forge/telemetry/metrics.h"

namespace forge::train {

HostReservation::~HostReservation() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

uint64_t HostReservation::start(Device device, std::vector<size_t> bytes) {
  started_ = true;
  uint64_t total = 0;
  for (size_t b : bytes) total += b;
  if (total == 0) return 0;
  requested_ = total;
  thread_ = std::thread([this, device, bytes = std::move(bytes)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      reserved_ = ops::reserve_host_copies(device, bytes, &stop_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return total;
}

std::string HostReservation::wait() {
  if (!thread_.joinable()) return "";
  thread_.join();
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.2f", seconds_);
  std::string line = "checkpoint: " + telemetry::format_bytes(static_cast<double>(reserved_)) +
                     " of pinned host memory for the snapshots reserved in the background in " + secs + " s";
  if (!error_.empty())
    line += " (stopped: " + error_ + ")";
  else if (reserved_ + (uint64_t{64} << 20) < requested_)
    line += " (the host gave no more page-locked memory: the snapshot allocates the rest)";
  return line;
}

}  // namespace forge::train
