#pragma once
// Checkpoints written while training goes on (checkpoint.async), or at once.
//
// Note [async checkpoints]: a checkpoint is taken in two parts.
//   1. At the step boundary, on the training thread (collective where the layout needs it):
//      Strategy::snapshot_checkpoint gathers what each rank writes (ZeRO-3's parameters,
//      tensor-parallel pieces, pipeline stages) and copies it to host memory (ops::host_copy:
//      pinned memory, one device-to-host copy, then a wait for it). Training may change its
//      tensors from then on. The result is a CheckpointJob: this rank's optimizer shard file,
//      and on rank 0 the rest of the checkpoint (CheckpointData) to publish.
//   2. On the writer's thread (checkpoint.async = true) or at once (false): the shard file is
//      written into the checkpoint's staging directory (atomically: its name appears complete
//      or not at all); rank 0 waits until every shard file it expects is there (the ranks share
//      the run directory's file system), then writes the model, optimizer and state files with
//      the shards and a manifest into a directory it publishes atomically (io/checkpoint.h), and
//      prunes the oldest checkpoints. Nothing in part 2 communicates between processes.
// A new checkpoint first waits for the previous one still being written on this rank (so one
// snapshot's host memory is in use at a time); a failed write (a full disk, a NaN in the state:
// io::check_finite) is rethrown on the training thread at the next check(), which the trainer
// calls every step, so the run stops with that error; the previous checkpoint stays the
// latest. A crash at any moment leaves the previous checkpoint complete: the new one is
// published by one rename, after everything it holds is on disk.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/io/checkpoint.h"
#include "forge/parallel/dp_state.h"

namespace forge::train {

// What one rank writes for one checkpoint, in host memory.
struct CheckpointJob {
  int64_t step = 0;
  std::filesystem::path run_dir;  // <run dir>: pruned after publishing
  std::filesystem::path dir;      // <run dir>/checkpoints/step_N
  std::filesystem::path staging;  // where the ranks' shard files meet (Note [data-parallel checkpoints])
  int64_t keep_last = 1;
  // This rank's optimizer state by parameter ranges (parallel/sharded_state.h), written as
  // staging / file.
  struct Shard {
    std::string file;
    std::vector<parallel::ShardPiece> pieces;
    std::vector<std::map<std::string, Tensor>> state;
    std::vector<int64_t> steps;
  };
  std::optional<Shard> shard;
  // Rank 0: the checkpoint to publish; its move_in lists the staging files every rank writes.
  std::optional<io::CheckpointData> publish;
  uint64_t host_bytes = 0;  // the snapshot's size in host memory (the log's figure)
};

// A job for the checkpoint of `step` in run_dir (its dir set; no staging, shard or publish yet).
CheckpointJob checkpoint_job(const std::filesystem::path& run_dir, int64_t step, int64_t keep_last);

// How long a checkpoint took: the training thread's stall, and the write.
struct CheckpointTiming {
  int64_t step = 0;
  double write_s = 0.0;     // part 2, on the writer
  uint64_t bytes = 0;       // of the snapshot
};

class CheckpointWriter {
 public:
  // async: part 2 on a thread of its own; else inside submit(). `wait_s`: how long rank 0 waits
  // for the other ranks' shard files before it gives up (an error).
  CheckpointWriter(bool async, double wait_s);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits until no job is in flight on this rank; rethrows a failed job's error.
  void wait();
  // Writes `job` (after wait()). Synchronous writers return when it is written.
  void submit(CheckpointJob job);
  // Rethrows the error of a job that failed; never blocks.
  void check();
  // The timings of jobs finished since the last call (for the log and metrics).
  std::vector<CheckpointTiming> take_finished();
  bool async() const { return async_; }

 private:
  void run(CheckpointJob& job);
  void loop();

  const bool async_;
  const double wait_s_;
  std::mutex m_;
  std::condition_variable cv_;
  std::optional<CheckpointJob> pending_;  // the job in flight (async)
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::vector<CheckpointTiming> finished_;
  std::thread thread_;
};

// Writes a CheckpointJob's part 2 (what CheckpointWriter runs); exposed for tests.
CheckpointTiming write_checkpoint_job(const CheckpointJob& job, double wait_s);

}  // namespace forge::train
