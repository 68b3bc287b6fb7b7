#pragma once
// The GPU kernels of a stretch of a run, from CUPTI's activity records (the records Nsight
// Systems reads), with no profiler installed: CUPTI is loaded at run time (dlopen) from the CUDA
// toolkit only when asked for, so a run that does not trace neither loads nor needs it. For the
// step trace of telemetry.profile_steps (train/step_trace.h, Note [step trace]).
//
//   cuda::KernelTrace k;
//   if (k.start()) { ... the traced steps ...; k.stop(); }   // stop() waits for the device
//   for (const auto& r : k.records()) ...                    // name, start/end (ns, CUPTI's clock)
//   k.now_ns();                                              // CUPTI's clock now, to align with the host
// One KernelTrace at a time in a process (CUPTI's activity buffers are process-wide).
#include <cstdint>
#include <string>
#include <vector>

namespace forge::cuda {

struct KernelRecord {
  std::string name;  // demangled
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0;
};

class KernelTrace {
 public:
  KernelTrace() = default;
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Loads CUPTI and turns on kernel records; false (note() says why) when it cannot: no CUPTI
  // library, a build without its header, another CUPTI client (a profiler) already collecting.
  bool start();
  // Waits for the device, flushes the records and turns them off (only after start()).
  void stop();
  uint64_t now_ns() const;  // CUPTI's timestamp now (0 when not started)
  const std::vector<KernelRecord>& records() const { return records_; }
  const std::string& note() const { return note_; }

 private:
  bool on_ = false;
  std::string note_;
  std::vector<KernelRecord> records_;
};

}  // namespace forge::cuda
