#pragma once
// Device-side timing with CUDA events for benchmarks (forge bench, docs/bench.md). Plain C++
// (no CUDA headers), so that code outside backends/cuda can include it under FORGE_WITH_CUDA.
//
//   auto ms = cuda::time_with_events(0, 20, [&] { cuda::matmul(a, b, out); });  // 20 timings
#include <functional>
#include <vector>

namespace forge::cuda {

// Runs `fn` (which queues work on `device`'s current stream) `repeats` times back to back,
// each between a pair of timing events recorded on that stream, then waits for the last
// event; returns the milliseconds of each run (event elapsed time, ~0.5 us resolution).
std::vector<double> time_with_events(int device, int repeats, const std::function<void()>& fn);

// Blocks the host until the work queued so far on `device`'s current stream has completed.
void synchronize_current_stream(int device);

}  // namespace forge::cuda
