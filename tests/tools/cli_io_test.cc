// `zinf io` as a user runs it: a huge --size streams through a bounded ring (no
// std::bad_alloc), bad values are refused before the header, and a read on a read-only
// filesystem does not try to open anything for writing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/tools/file_bytes.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

using zinf::testing::run_zinf;
using zinf::testing::ZinfRun;

TEST(CliIo, HugeSizeStreamsThroughABoundedRing) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  zinf::testing::TmpfsMount mount(dir.path(), 4 << 20);
  if (!mount.ok()) GTEST_SKIP() << mount.why_not();
  ZinfRun run = run_zinf({"io", dir.path(), "--size", "8T", "--loops", "1", "--backend", "psync"});
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_EQ(run.err.find("bad_alloc"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("No space left on device"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("pinned"), std::string::npos) << run.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "zinf-io.dat left behind";
}

TEST(CliIo, BadValuesAreRefusedBeforeTheHeader) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<std::vector<std::string>> cases = {
      {"--loops", "0"},
      {"--size", "0"},
      {"--size", "4096", "--block-size", "2G"},
      {"--size", "4096", "--block-size", "1000"},
      {"--size", "4096", "--queue-depth", "0"},
  };
  for (const std::vector<std::string>& extra : cases) {
    std::vector<std::string> args = {"io", dir.path()};
    args.insert(args.end(), extra.begin(), extra.end());
    ZinfRun run = run_zinf(args);
    std::string what = extra[extra.size() - 2] + " " + extra.back();
    EXPECT_EQ(run.exit_code, 1) << what << "\n" << run.out << run.err;
    EXPECT_EQ(run.out, "") << what << ": a header was printed before the error";
    EXPECT_NE(run.err.find(extra[extra.size() - 2]), std::string::npos)
        << what << ": the error does not name the option: " << run.err;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(CliIo, ReadOnAReadOnlyFilesystem) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  zinf::testing::TmpfsMount mount(dir.path(), 8 << 20);
  if (!mount.ok()) GTEST_SKIP() << mount.why_not();
  std::string file = dir.file("data.bin");
  zinf::testing::write_random_file(file, 1 << 20, 7);
  if (!mount.remount_read_only()) GTEST_SKIP() << mount.why_not();

  // An existing file is read, opened read-only.
  ZinfRun ok = run_zinf({"io", file, "--read", "--size", "1M", "--loops", "1"});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  // In a folder without zinf-io.dat the file would have to be written first: the error says
  // the filesystem is read-only (before anything is printed), not "opening for writing".
  ZinfRun folder = run_zinf({"io", dir.path(), "--read", "--size", "1M", "--loops", "1"});
  EXPECT_EQ(folder.exit_code, 1) << folder.out << folder.err;
  EXPECT_NE(folder.err.find("read-only"), std::string::npos) << folder.err;
  EXPECT_EQ(folder.err.find("opening for writing"), std::string::npos) << folder.err;
  EXPECT_EQ(folder.out, "");
}

}  // namespace
}  // namespace zinf::tools
