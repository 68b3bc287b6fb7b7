// Checkpoints written at once or on a thread of their own (Note [async checkpoints] in
// checkpoint_writer.h).
#include "forge/train/checkpoint_writer.h"

#include <chrono>
#include <system_error>

#include "forge/core/error.h"
#include "forge/parallel/sharded_state.h"

namespace forge::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Rank 0 waits for the other ranks' shard files: each appears complete (written through a
// temporary and a rename), so its name is enough.
void wait_for_files(const std::vector<fs::path>& files, double wait_s, int64_t step) {
  const auto t0 = Clock::now();
  for (const auto& f : files) {
    std::error_code ec;
    while (!fs::exists(f, ec)) {
      FORGE_CHECK(seconds_since(t0) < wait_s, "checkpoint of step ", step, ": '", f.string(), "' did not appear within ",
                  wait_s, " s (FORGE_DIST_TIMEOUT): the rank that writes it stopped, or the ranks do not share the "
                  "run directory's file system");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace

CheckpointJob checkpoint_job(const fs::path& run_dir, int64_t step, int64_t keep_last) {
  CheckpointJob job;
  job.step = step;
  job.run_dir = run_dir;
  job.dir = io::checkpoint_path(run_dir, step);
  job.keep_last = keep_last;
  return job;
}

CheckpointTiming write_checkpoint_job(const CheckpointJob& job, double wait_s) {
  const auto t0 = Clock::now();
  if (job.shard)
    parallel::write_optimizer_shard(job.staging / job.shard->file, job.shard->pieces, job.shard->state, job.shard->steps,
                                job.step);
  if (job.publish) {
    wait_for_files(job.publish->move_in, wait_s, job.step);
    io::save_checkpoint(job.dir, *job.publish);
    std::error_code ec;
    if (!job.staging.empty()) fs::remove_all(job.staging, ec);
    io::prune_checkpoints(job.run_dir, static_cast<size_t>(job.keep_last));
  }
  return {.step = job.step, .write_s = seconds_since(t0), .bytes = job.host_bytes};
}

CheckpointWriter::CheckpointWriter(bool async, double wait_s) : async_(async), wait_s_(wait_s) {
  if (async_) thread_ = std::thread([this] { loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!async_) return;
  {
    const std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // a job in flight is finished first: it never leaves a half-written checkpoint behind
}

void CheckpointWriter::run(CheckpointJob& job) {
  CheckpointTiming t = write_checkpoint_job(job, wait_s_);
  const std::lock_guard<std::mutex> lock(m_);
  finished_.push_back(t);
}

void CheckpointWriter::loop() {
  std::unique_lock<std::mutex> lock(m_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || pending_.has_value(); });
    if (!pending_) return;  // stopping with nothing to write
    CheckpointJob job = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    std::exception_ptr err;
    try {
      CheckpointTiming t = write_checkpoint_job(job, wait_s_);
      lock.lock();
      finished_.push_back(t);
    } catch (...) {
      err = std::current_exception();
      lock.lock();
    }
    if (err && !error_) error_ = err;
    // The snapshot's host memory is released before the job counts as done, so the next
    // snapshot reuses it (the pinned allocator's cache) instead of adding to it.
    lock.unlock();
    job = CheckpointJob{};
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) std::rethrow_exception(error_);
}

void CheckpointWriter::check() {
  const std::lock_guard<std::mutex> lock(m_);
  if (error_) std::rethrow_exception(error_);
}

void CheckpointWriter::submit(CheckpointJob job) {
  wait();
  if (!async_) {
    run(job);
    return;
  }
  {
    const std::lock_guard<std::mutex> lock(m_);
    pending_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
}

std::vector<CheckpointTiming> CheckpointWriter::take_finished() {
  const std::lock_guard<std::mutex> lock(m_);
  std::vector<CheckpointTiming> out;
  out.swap(finished_);
  return out;
}

}  // namespace forge::train
