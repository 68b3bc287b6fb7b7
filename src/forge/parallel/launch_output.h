#pragma once
// What forge launch prints of its ranks' output (Note [launch output]).
//
// Every line of a rank comes out once, prefixed "[rank N] " (unless the prefix is off). Lines
// that every rank prints alike are what a newcomer drowns in, so an error line ("forge: error:
// ...", "forge: warning: ...") is held for a moment (hold_seconds, or until every rank printed
// it): the same line from other ranks in that time joins it, and it comes out once as "[ranks 0-3] forge: error: ...". A rank's
// other output flushes its held lines first, so each rank's lines keep their order; the same
// line arriving after it came out prints as "[rank 5] (the same as ranks 0-3)".
//
// Under Open MPI the ranks' lines arrive through mpirun with --tag-output ("[1,2]<stderr>:text"):
// the tag gives the rank (Open MPI tags each piece a rank wrote; the pieces are joined into lines). mpirun's own framed blocks (between lines of dashes) are passed on
// unless they only restate what the launcher says itself: "Primary job terminated normally, but 1
// process returned a non-zero exit code" is dropped, and "mpirun detected that one or more
// processes exited with non-zero status" / "mpirun noticed that process rank R ... exited on
// signal S" become first_failure(), which the launcher names in its own one line. Open MPI
// does not always print the block that names the rank (about 1 job in 20 here ends with the
// "Primary job" block alone): then a_rank_failed() is all there is, and the launcher says that.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace forge::parallel {

// The first rank mpirun saw fail: its exit code, or the signal that killed it.
struct RankFailure {
  int rank = -1;
  int exit_code = -1;  // >= 0 when it exited
  int signal = 0;      // > 0 when a signal killed it
};

// "0", "0, 2", "0-3", "0-2, 5" (a sorted set of ranks).
std::string format_ranks(const std::set<int>& ranks);

class LaunchOutput {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    bool prefix = true;          // "[rank N] " before a rank's lines
    bool mpirun_tags = false;    // the lines come from mpirun --tag-output (Open MPI)
    bool tag_space = false;      // Open MPI 5: a space after the tag's colon
    double hold_seconds = 3.0;   // how long an error line waits for the same line from other ranks
    int world = 0;               // the ranks: a line every rank printed comes out at once
  };
  // Receives each line to print, with its newline; is_err: it goes to stderr.
  using Sink = std::function<void(bool is_err, const std::string& text)>;

  LaunchOutput(Options opt, Sink sink);

  // One line (without its newline) of a child's stdout or stderr. `rank`: the rank of a direct
  // child, -1 for mpirun (its tag, if any, names the rank).
  void line(int rank, bool is_err, std::string_view text, Clock::time_point now = Clock::now());
  // Prints the held lines whose time is up.
  void tick(Clock::time_point now = Clock::now());
  // Prints everything still held (the job is over).
  void finish();

  const std::optional<RankFailure>& first_failure() const { return first_failure_; }
  // Open MPI said a rank returned a non-zero exit code ("Primary job terminated normally, but
  // N process returned ..."), with or without naming it.
  bool a_rank_failed() const { return a_rank_failed_ || first_failure_.has_value(); }

 private:
  struct Held {
    std::string text;
    bool is_err = false;
    std::set<int> ranks;
    Clock::time_point since;
    uint64_t id = 0;  // which line this is (texts repeat)
  };
  void rank_line(int rank, bool is_err, std::string_view text, Clock::time_point now);
  void flush_held(size_t i);
  void flush_rank(int rank);
  void tagged_line(bool is_err, std::string_view text, Clock::time_point now);
  void mpirun_line(bool is_err, std::string_view text);
  void end_block();
  void print(bool is_err, const std::string& prefix, std::string_view text);
  std::string rank_prefix(const std::set<int>& ranks) const;

  Options opt_;
  Sink sink_;
  std::vector<Held> held_;
  uint64_t next_id_ = 0;
  std::vector<std::pair<std::string, std::set<int>>> printed_;  // held lines already printed
  std::map<std::pair<int, bool>, std::string> partial_;  // (rank, stderr): a line's pieces so far
  bool in_block_ = false;
  bool block_is_err_ = false;
  std::vector<std::string> block_;
  std::optional<RankFailure> first_failure_;
  bool a_rank_failed_ = false;
};

}  // namespace forge::parallel
