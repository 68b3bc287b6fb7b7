// Note [launch output] (parallel/launch_output.h): what forge launch prints of its ranks' lines: each
// error once naming its ranks, the ranks' own order kept, Open MPI's tagged pieces joined into
// lines, and mpirun's blocks dropped only where they restate the launcher.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "forge/parallel/launch_output.h"

namespace forge::parallel {
namespace {

using Clock = LaunchOutput::Clock;
using std::chrono::milliseconds;

struct Printed {
  std::string out, err;
};

// A LaunchOutput writing into `p`, holding errors for 1 s, for a job of `world` ranks.
LaunchOutput make(Printed& p, int world = 4, bool mpirun = false) {
  return LaunchOutput({.prefix = true, .mpirun_tags = mpirun, .tag_space = false, .hold_seconds = 1.0, .world = world},
                      [&p](bool is_err, const std::string& text) { (is_err ? p.err : p.out) += text; });
}

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t i = s.find(part); i != std::string::npos; i = s.find(part, i + 1)) ++n;
  return n;
}

TEST(FormatRanks, RunsAndSingles) {
  EXPECT_EQ(format_ranks({0}), "0");
  EXPECT_EQ(format_ranks({0, 1}), "0, 1");
  EXPECT_EQ(format_ranks({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(format_ranks({0, 2}), "0, 2");
  EXPECT_EQ(format_ranks({0, 1, 2, 5, 7, 8, 9}), "0-2, 5, 7-9");
}

TEST(LaunchOutput, OrdinaryLinesPassAtOnceWithTheirRank) {
  Printed p;
  LaunchOutput o = make(p);
  o.line(0, false, "step 1/10 | loss 5.0");
  o.line(2, true, "something on stderr");
  EXPECT_EQ(p.out, "[rank 0] step 1/10 | loss 5.0\n");
  EXPECT_EQ(p.err, "[rank 2] something on stderr\n");
}

TEST(LaunchOutput, AnErrorEveryRankPrintsComesOutOnceAtOnce) {
  Printed p;
  LaunchOutput o = make(p);
  const auto t = Clock::now();
  for (int r : {2, 0, 3}) o.line(r, true, "forge: error: model.n_head = 5 does not divide 128", t);
  EXPECT_EQ(p.err, "") << "held until every rank printed it or the time is up";
  o.line(1, true, "forge: error: model.n_head = 5 does not divide 128", t);
  EXPECT_EQ(p.err, "[ranks 0-3] forge: error: model.n_head = 5 does not divide 128\n");
  o.finish();
  EXPECT_EQ(count(p.err, "forge: error"), 1);
}

TEST(LaunchOutput, AHeldErrorComesOutWhenItsTimeIsUp) {
  Printed p;
  LaunchOutput o = make(p);
  const auto t = Clock::now();
  o.line(1, true, "forge: error: rank 1's own trouble", t);
  o.line(3, true, "forge: error: rank 1's own trouble", t + milliseconds(300));
  o.tick(t + milliseconds(900));
  EXPECT_EQ(p.err, "");
  o.tick(t + milliseconds(1000));
  EXPECT_EQ(p.err, "[ranks 1, 3] forge: error: rank 1's own trouble\n");
  // The same line later: one short line naming where it was said.
  o.line(0, true, "forge: error: rank 1's own trouble", t + milliseconds(2000));
  EXPECT_EQ(count(p.err, "forge: error"), 1);
  EXPECT_NE(p.err.find("[rank 0] (the same as ranks 1, 3)\n"), std::string::npos) << p.err;
}

TEST(LaunchOutput, DifferentErrorsStayApartAndARankKeepsItsOrder) {
  Printed p;
  LaunchOutput o = make(p);
  const auto t = Clock::now();
  o.line(0, true, "forge: error: first", t);
  o.line(1, true, "forge: error: second", t);
  o.line(0, true, "after the error, on rank 0", t);  // rank 0's held error comes out first
  EXPECT_EQ(p.err, "[rank 0] forge: error: first\n[rank 0] after the error, on rank 0\n");
  o.finish();
  EXPECT_EQ(p.err, "[rank 0] forge: error: first\n[rank 0] after the error, on rank 0\n[rank 1] forge: error: second\n");
}

// Flushing a line first flushes the earlier held lines of its ranks, and theirs: a chain.
TEST(LaunchOutput, HeldLinesOfARankComeOutInOrderThroughAChain) {
  Printed p;
  LaunchOutput o = make(p, 4);
  const auto t = Clock::now();
  o.line(0, true, "forge: error: a", t);  // rank 0
  o.line(1, true, "forge: error: b", t);  // rank 1
  o.line(1, true, "forge: error: c", t);  // rank 1, then rank 0 joins it
  o.line(0, true, "forge: error: c", t);
  o.line(0, false, "rank 0 goes on", t);  // flushes c (ranks 0, 1), which needs a and b first
  EXPECT_EQ(p.err, "[rank 0] forge: error: a\n[rank 1] forge: error: b\n[ranks 0, 1] forge: error: c\n");
  EXPECT_EQ(p.out, "[rank 0] rank 0 goes on\n");
  o.finish();
  EXPECT_EQ(p.err, "[rank 0] forge: error: a\n[rank 1] forge: error: b\n[ranks 0, 1] forge: error: c\n");
}

TEST(LaunchOutput, WithoutThePrefix) {
  Printed p;
  LaunchOutput o({.prefix = false, .world = 2}, [&p](bool, const std::string& text) { p.out += text; });
  o.line(0, false, "hello");
  o.line(0, true, "forge: warning: w");
  o.line(1, true, "forge: warning: w");
  EXPECT_EQ(p.out, "hello\nforge: warning: w\n");
}

TEST(LaunchOutput, OpenMpiTagsNameTheRankAndPiecesJoinIntoLines) {
  Printed p;
  LaunchOutput o = make(p, 2, /*mpirun=*/true);
  o.line(-1, false, "[1,1]<stdout>:step 1 of rank 1");
  EXPECT_EQ(p.out, "[rank 1] step 1 of rank 1\n");
  // Each write of a rank is tagged; rank 1's piece arrives between rank 0's two pieces.
  o.line(-1, true, "[1,0]<stderr>:forge: error: [1,1]<stderr>:forge: error: bad [1,0]<stderr>:bad");
  o.line(-1, true, "[1,1]<stderr>:config[1,1]<stderr>:");
  EXPECT_EQ(p.err, "") << "both held: rank 0 said 'bad', rank 1 'bad config'";
  // Rank 0 says 'bad config' too: every rank said it, it comes out, after rank 0's earlier line.
  o.line(-1, true, "[1,0]<stderr>:forge: error: bad config");
  EXPECT_EQ(p.err, "[rank 0] forge: error: bad\n[ranks 0, 1] forge: error: bad config\n");
  // An empty line of a rank, and text that only looks like a tag.
  o.line(-1, false, "[1,0]<stdout>:");
  o.line(-1, false, "[1,0]<stdout>:[x,1]<stdout>: and [12]<stdout>: stay");
  EXPECT_EQ(p.out, "[rank 1] step 1 of rank 1\n[rank 0] \n[rank 0] [x,1]<stdout>: and [12]<stdout>: stay\n");
}

TEST(LaunchOutput, OpenMpiBlocksThatRestateTheLauncherAreDropped) {
  Printed p;
  LaunchOutput o = make(p, 2, true);
  const std::string dashes(74, '-');
  for (const std::string& l : {dashes, std::string("Primary job  terminated normally, but 1 process returned"),
                               std::string("a non-zero exit code. Per user-direction, the job has been aborted."), dashes,
                               dashes,
                               std::string("mpirun detected that one or more processes exited with non-zero status, "
                                           "thus causing"),
                               std::string("the job to be terminated. The first process to do so was:"), std::string(),
                               std::string("  Process name: [[19304,1],1]"), std::string("  Exit code:    3"), dashes})
    o.line(-1, true, l);
  o.finish();
  EXPECT_EQ(p.err, "");
  EXPECT_TRUE(o.a_rank_failed());
  ASSERT_TRUE(o.first_failure().has_value());
  EXPECT_EQ(o.first_failure()->rank, 1);
  EXPECT_EQ(o.first_failure()->exit_code, 3);
  EXPECT_EQ(o.first_failure()->signal, 0);
}

// Open MPI sometimes ends a job with the "Primary job" block alone (seen 2 times in 40 here):
// no rank is named, but a rank failed - still dropped, and still known.
TEST(LaunchOutput, OpenMpiPrimaryJobBlockAloneSaysARankFailed) {
  Printed p;
  LaunchOutput o = make(p, 2, true);
  const std::string dashes(74, '-');
  EXPECT_FALSE(o.a_rank_failed());
  for (const std::string& l : {dashes, std::string("Primary job  terminated normally, but 1 process returned"),
                               std::string("a non-zero exit code. Per user-direction, the job has been aborted."), dashes})
    o.line(-1, true, l);
  o.finish();
  EXPECT_EQ(p.err, "");
  EXPECT_TRUE(o.a_rank_failed());
  EXPECT_FALSE(o.first_failure().has_value());
}

TEST(LaunchOutput, OpenMpiSignalBlockAndOtherBlocks) {
  Printed p;
  LaunchOutput o = make(p, 2, true);
  const std::string dashes(74, '-');
  o.line(-1, true, dashes);
  o.line(-1, true, "mpirun noticed that process rank 0 with PID 0 on node host exited on signal 9 (Killed).");
  o.line(-1, true, dashes);
  ASSERT_TRUE(o.first_failure().has_value());
  EXPECT_EQ(o.first_failure()->rank, 0);
  EXPECT_EQ(o.first_failure()->signal, 9);
  // A block that says something the launcher does not: passed on whole.
  o.line(-1, true, dashes);
  o.line(-1, true, "There are not enough slots available in the system to satisfy the 64");
  o.line(-1, true, dashes);
  EXPECT_EQ(p.err, dashes + "\nThere are not enough slots available in the system to satisfy the 64\n" + dashes + "\n");
  // mpirun's own lines outside a block, and a block cut short by the end of the job.
  p.err.clear();
  o.line(-1, true, "mpirun: a warning of its own");
  o.line(-1, true, dashes);
  o.line(-1, true, "half a block");
  o.finish();
  EXPECT_EQ(p.err, "mpirun: a warning of its own\n" + dashes + "\nhalf a block\n");
}

TEST(LaunchOutput, APieceWithoutItsNewlineComesOutAtTheEnd) {
  Printed p;
  LaunchOutput o = make(p, 2, true);
  o.line(-1, false, "[1,0]<stdout>:no newline yet[1,0]<stdout>:");
  EXPECT_EQ(p.out, "[rank 0] no newline yet\n");
  o.line(-1, false, "[1,1]<stdout>:cut ");  // the physical line ended: the rank's line too
  o.finish();
  EXPECT_EQ(p.out, "[rank 0] no newline yet\n[rank 1] cut \n");
}

}  // namespace
}  // namespace forge::parallel
