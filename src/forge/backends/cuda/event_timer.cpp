#include "forge/backends/cuda/event_timer.h"

#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"

namespace forge::cuda {

std::vector<double> time_with_events(int device, int repeats, const std::function<void()>& fn) {
  DeviceGuard g(device);
  const Stream stream = Stream::current(device);
  std::vector<Event> start, stop;
  start.reserve(static_cast<size_t>(repeats));
  stop.reserve(static_cast<size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    start.emplace_back(true);
    stop.emplace_back(true);
  }
  for (int i = 0; i < repeats; ++i) {
    start[static_cast<size_t>(i)].record(stream);
    fn();
    stop[static_cast<size_t>(i)].record(stream);
  }
  std::vector<double> ms;
  if (repeats <= 0) return ms;
  stop.back().synchronize();  // same stream: every earlier event has completed too
  ms.reserve(static_cast<size_t>(repeats));
  for (int i = 0; i < repeats; ++i)
    ms.push_back(static_cast<double>(start[static_cast<size_t>(i)].elapsed_ms(stop[static_cast<size_t>(i)])));
  return ms;
}

void synchronize_current_stream(int device) {
  DeviceGuard g(device);
  Stream::current(device).synchronize();
}

}  // namespace forge::cuda
