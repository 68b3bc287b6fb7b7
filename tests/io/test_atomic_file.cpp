// forge::io atomic writes (src/forge/io/atomic_file.h): a write that fails at any point (the
// writer throws, a real write() fails mid-file, the filler of a directory throws, the process
// dies between the two renames of the fallback) leaves the previous file or directory intact
// and, after the API's own cleanup (or recover_directory), no temporaries behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include "io/io_testing.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

using io::replace_directory_atomic;
using io::write_file_atomic;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

void write_text(const fs::path& p, const std::string& text) { write_file_atomic(p, text); }

TEST(AtomicFile, WritesAndReplaces) {
  ScratchDir dir;
  const fs::path p = dir / "f.txt";
  write_text(p, "first");
  EXPECT_EQ(slurp(p), "first");
  write_file_atomic(p, [](io::OutputFile& f) {
    f.write("sec", 3);
    f.write(std::string_view("ond"));
    EXPECT_EQ(f.size(), 6u);
  });
  EXPECT_EQ(slurp(p), "second");
  EXPECT_EQ(io::read_file(p), "second");
  write_text(p, "");
  EXPECT_EQ(slurp(p), "");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, WriterThrowingMidWriteKeepsTheOldFile) {
  ScratchDir dir;
  const fs::path p = dir / "state.json";
  write_text(p, "old contents");
  const std::string e = error_of([&] {
    write_file_atomic(p, [](io::OutputFile& f) {
      f.write(std::string(100000, 'n'));
      throw std::runtime_error("disk on fire");
    });
  });
  EXPECT_HAS(e, p.string());
  EXPECT_HAS(e, "disk on fire");
  EXPECT_HAS(e, "unchanged");
  EXPECT_EQ(slurp(p), "old contents");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"state.json"});

  // A forge::Error from the writer, and a target that did not exist before.
  const fs::path q = dir / "new.bin";
  EXPECT_HAS(error_of([&] { write_file_atomic(q, [](io::OutputFile&) { FORGE_THROW("no more data"); }); }),
             "no more data");
  EXPECT_FALSE(fs::exists(q));
  // Anything else thrown passes through unchanged, after the same cleanup.
  EXPECT_THROW(write_file_atomic(q, [](io::OutputFile& f) {
                 f.write("x", 1);
                 throw 42;
               }),
               int);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"state.json"});
}

// A real failure of write(2) in the middle of a file: the file-size limit (RLIMIT_FSIZE) makes
// the kernel refuse the bytes past it with EFBIG.
TEST(AtomicFile, FailingWriteSyscallKeepsTheOldFile) {
  ScratchDir dir;
  const fs::path p = dir / "model.safetensors";
  io::save_safetensors(p, {{"w", random_bits(DType::f32, {16}, 1)}});
  const std::string before = slurp(p);

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string e = error_of([&] { io::save_safetensors(p, {{"w", random_bits(DType::f32, {100000}, 2)}}); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_HAS(e, p.string());
  EXPECT_HAS(e, "File too large");
  EXPECT_HAS(e, "errno");
  EXPECT_EQ(slurp(p), before);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(AtomicFile, SyscallErrorsNameThePathAndTheErrnoText) {
  ScratchDir dir;
  const fs::path missing = dir / "no" / "such" / "f.txt";
  std::string e = error_of([&] { write_text(missing, "x"); });
  EXPECT_HAS(e, missing.string());
  EXPECT_HAS(e, "No such file or directory");

  fs::create_directory(dir / "d");
  e = error_of([&] { write_text(dir / "d", "x"); });  // rename over a directory fails
  EXPECT_HAS(e, (dir / "d").string());
  EXPECT_HAS(e, "Is a directory");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"d"});

  e = error_of([&] { io::read_file(dir / "absent"); });
  EXPECT_HAS(e, (dir / "absent").string());
  EXPECT_HAS(e, "No such file or directory");
}

TEST(AtomicFile, TemporaryNames) {
  EXPECT_TRUE(io::is_temporary_name("model.safetensors.tmp.1234.0123456789abcdef"));
  EXPECT_TRUE(io::is_temporary_name("step_00000100.tmp.7.ffffffffffffffff"));
  EXPECT_TRUE(io::is_temporary_name("step_00000100.old.7.0000000000000000"));
  EXPECT_FALSE(io::is_temporary_name("step_00000100"));
  EXPECT_FALSE(io::is_temporary_name("model.safetensors"));
  EXPECT_FALSE(io::is_temporary_name(".tmp.1.0123456789abcdef"));         // no base name
  EXPECT_FALSE(io::is_temporary_name("a.tmp.x1.0123456789abcdef"));       // pid not digits
  EXPECT_FALSE(io::is_temporary_name("a.tmp.1.0123456789ABCDEF"));        // hex is lowercase
  EXPECT_FALSE(io::is_temporary_name("a.tmp.1.0123456789abcde"));         // 15 digits
  EXPECT_FALSE(io::is_temporary_name("a.bak.1.0123456789abcdef"));
}

// ---- directories --------------------------------------------------------------------------

void fill_with(const fs::path& d, const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [name, text] : files) {
    fs::create_directories((d / name).parent_path());
    spit(d / name, text);
  }
}

class AtomicDirectory : public ::testing::TestWithParam<bool> {
 protected:
  // The parameter: whether the RENAME_EXCHANGE step may be used (false: two-rename fallback).
  void replace(const fs::path& d, const io::DirectoryFiller& filler) {
    io::detail::replace_directory_atomic(d, filler, GetParam());
  }
};

TEST_P(AtomicDirectory, CreatesAndReplaces) {
  ScratchDir root;
  const fs::path d = root / "runs" / "ck";  // the parent is created
  replace(d, [](const fs::path& tmp) { fill_with(tmp, {{"a.txt", "A1"}, {"sub/b.txt", "B1"}}); });
  EXPECT_EQ(slurp(d / "a.txt"), "A1");
  EXPECT_EQ(slurp(d / "sub" / "b.txt"), "B1");

  replace(d, [](const fs::path& tmp) { fill_with(tmp, {{"c.txt", "C2"}}); });
  EXPECT_EQ(listing(d), std::vector<std::string>{"c.txt"});
  EXPECT_EQ(slurp(d / "c.txt"), "C2");
  EXPECT_EQ(listing(root / "runs"), std::vector<std::string>{"ck"});

  // A trailing slash names the same directory.
  replace(d.string() + "/", [](const fs::path& tmp) { fill_with(tmp, {{"d.txt", "D3"}}); });
  EXPECT_EQ(listing(d), std::vector<std::string>{"d.txt"});
  EXPECT_EQ(listing(root / "runs"), std::vector<std::string>{"ck"});
}

TEST_P(AtomicDirectory, FillerThrowingMidWriteKeepsTheOldDirectory) {
  ScratchDir root;
  const fs::path d = root / "ck";
  replace(d, [](const fs::path& tmp) { fill_with(tmp, {{"model", "old model"}, {"state", "old state"}}); });
  const std::string e = error_of([&] {
    replace(d, [](const fs::path& tmp) {
      fill_with(tmp, {{"model", "new model"}});
      throw std::runtime_error("killed while writing state");
    });
  });
  EXPECT_HAS(e, d.string());
  EXPECT_HAS(e, "killed while writing state");
  EXPECT_EQ(listing(d), (std::vector<std::string>{"model", "state"}));
  EXPECT_EQ(slurp(d / "model"), "old model");
  EXPECT_EQ(slurp(d / "state"), "old state");
  EXPECT_EQ(listing(root.path()), std::vector<std::string>{"ck"});

  // Same when there was no previous directory: nothing is left at all.
  EXPECT_THROW(replace(root / "fresh", [](const fs::path&) { FORGE_THROW("nope"); }), Error);
  EXPECT_EQ(listing(root.path()), std::vector<std::string>{"ck"});
}

TEST_P(AtomicDirectory, RefusesToReplaceAFile) {
  ScratchDir root;
  spit(root / "plain", "x");
  const std::string e = error_of([&] { replace(root / "plain", [](const fs::path&) {}); });
  EXPECT_HAS(e, (root / "plain").string());
  EXPECT_HAS(e, "not a directory");
  EXPECT_EQ(slurp(root / "plain"), "x");
  EXPECT_EQ(listing(root.path()), std::vector<std::string>{"plain"});
}

INSTANTIATE_TEST_SUITE_P(ExchangeOrTwoRenames, AtomicDirectory, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Exchange") : std::string("TwoRenames");
                         });

// The two-rename fallback dies after moving the old directory aside and before renaming the
// new one in: both are complete on disk, the target is missing. recover_directory puts the old
// one back and removes the rest.
TEST(AtomicDirectoryRecovery, CrashBetweenTheRenamesRestoresTheOldDirectory) {
  ScratchDir root;
  const fs::path d = root / "ck";
  fill_with(root / "ck.old.4242.0123456789abcdef", {{"model", "old model"}});
  fill_with(root / "ck.tmp.4242.fedcba9876543210", {{"model", "new model"}});
  fill_with(root / "other.tmp.1.0123456789abcdef", {{"x", "not ours"}});
  EXPECT_TRUE(io::recover_directory(d));
  EXPECT_EQ(slurp(d / "model"), "old model");
  EXPECT_EQ(listing(root.path()), (std::vector<std::string>{"ck", "other.tmp.1.0123456789abcdef"}));
}

TEST(AtomicDirectoryRecovery, RemovesLitterAndKeepsAnIntactDirectory) {
  ScratchDir root;
  const fs::path d = root / "ck";
  fill_with(d, {{"model", "current"}});
  fill_with(root / "ck.tmp.1.0000000000000001", {{"model", "half"}});  // a save killed while filling
  fill_with(root / "ck.old.2.0000000000000002", {{"model", "stale"}});  // a removal killed midway
  EXPECT_TRUE(io::recover_directory(d));
  EXPECT_EQ(slurp(d / "model"), "current");
  EXPECT_EQ(listing(root.path()), std::vector<std::string>{"ck"});
  EXPECT_FALSE(io::recover_directory(root / "never"));
}

TEST(AtomicDirectoryRecovery, PublicReplaceLeavesNoLitter) {
  ScratchDir root;
  for (int i = 0; i < 3; ++i) {
    replace_directory_atomic(root / "ck", [i](const fs::path& tmp) {
      io::write_file_atomic(tmp / "n", std::to_string(i));
    });
  }
  EXPECT_EQ(slurp(root / "ck" / "n"), "2");
  EXPECT_EQ(listing(root / "ck"), std::vector<std::string>{"n"});
  EXPECT_EQ(listing(root.path()), std::vector<std::string>{"ck"});
}

}  // namespace
}  // namespace forge::testing
