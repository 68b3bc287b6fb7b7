// FORGE_TRAIN_PHASES (contract in phase_marks.h).
#include "forge/train/phase_marks.h"

#include "forge/train/step_trace.h"

#include <cstdio>
#include <deque>
#include <sstream>
#include <vector>

#include "forge/backends/device_runtime.h"

namespace forge::train {

namespace {
std::string fixed3(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}
}  // namespace

struct PhaseMarks::Events {
  std::deque<std::vector<runtime::Event>> steps;
};

PhaseMarks::PhaseMarks(Device device, bool on)
    : events_(std::make_unique<Events>()), device_(device), on_(on && device.is_cuda()) {}

PhaseMarks::~PhaseMarks() = default;

void PhaseMarks::mark(int i) {
  if (trace_) trace_->mark(i);
  if (!on_) return;
  auto& steps = events_->steps;
  if (i == 0) {
    ++started_;
    if (started_ == kFirst + 1) {  // the measured steps begin: allocator and host-wait baselines
      const MemoryStats m = runtime::memory_stats(device_);
      allocs0_ = m.num_device_allocs + m.num_device_frees;
      waited_ = 0.0;
    }
    steps.emplace_back();
    fold(/*keep=*/3);
  }
  if (steps.empty() || static_cast<int>(steps.back().size()) != i) return;  // out of order: ignored
  steps.back().emplace_back(true);
  steps.back().back().record(device_);
}

std::string PhaseMarks::report() {
  if (!on_) return {};
  fold(/*keep=*/1);
  if (n_ == 0) return {};
  static const char* names[kMarks] = {"forward", "backward", "waiting for the reductions", "loss, norm and clip",
                                      "update", "between steps"};
  std::ostringstream os;
  double total = 0.0;
  for (double v : sum_) total += v;
  const double n = static_cast<double>(n_);
  os << "phases (FORGE_TRAIN_PHASES, mean ms per step over " << n_ << " steps): ";
  for (int i = 0; i < kMarks; ++i) os << (i ? ", " : "") << names[i] << " " << fixed3(sum_[static_cast<size_t>(i)] / n);
  os << "; total " << fixed3(total / n);
  const MemoryStats m = runtime::memory_stats(device_);
  os << "; host waited " << fixed3(1e3 * waited_ / static_cast<double>(started_ - kFirst))
     << " ms per step for the device; cudaMalloc/cudaFree calls during these steps: "
     << m.num_device_allocs + m.num_device_frees - allocs0_;
  return os.str();
}

void PhaseMarks::fold(size_t keep) {
  auto& steps = events_->steps;
  while (steps.size() > keep && steps.size() >= 2) {
    const auto& m = steps[0];
    const runtime::Event& next = steps[1].empty() ? m.front() : steps[1].front();
    const int64_t index = started_ - static_cast<int64_t>(steps.size()) + 1;  // 1-based step of steps[0]
    if (index > kFirst && m.size() == kMarks && !steps[1].empty()) {
      next.synchronize();
      for (int i = 0; i + 1 < kMarks; ++i)
        sum_[static_cast<size_t>(i)] += m[static_cast<size_t>(i)].elapsed_ms(m[static_cast<size_t>(i) + 1]);
      sum_[kMarks - 1] += m.back().elapsed_ms(next);
      ++n_;
    }
    steps.pop_front();
  }
}

}  // namespace forge::train
