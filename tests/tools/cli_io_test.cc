// `zinf io` as a user runs it: a --size the drive has no room for is refused before anything
// is written, bad values are refused before the header, and a read on a read-only filesystem
// does not try to open anything for writing.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
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

// A file-size limit (RLIMIT_FSIZE, soft) for the children started while it lives: a job that
// should have been refused for want of space is stopped (SIGXFSZ) at `bytes` instead of
// filling the drive.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = ::getrlimit(RLIMIT_FSIZE, &old_) == 0;
    rlimit limit = old_;
    limit.rlim_cur = std::min(bytes, old_.rlim_max);
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    if (ok_) ::setrlimit(RLIMIT_FSIZE, &old_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// A size the drive cannot hold is refused before the header and before any byte is
// written: exit 2 (a usage error), one line naming the file, the bytes needed and free.
// Without the check the job would fill the temp folder's drive: a 64 MiB file-size limit
// stops it first.
TEST(CliIo, SizeBeyondTheFreeSpaceIsRefusedBeforeWriting) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const FileSizeLimit limit(64 << 20);
  ASSERT_TRUE(limit.ok()) << std::strerror(errno);
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const uint64_t size = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize + (uint64_t{1} << 30);
  for (const char* op : {"--write", "--read"}) {
    ZinfRun run = run_zinf({"io", dir.path(), "--size", std::to_string(size), op, "--loops", "1",
                            "--backend", "psync"});
    EXPECT_EQ(run.exit_code, 2) << op << "\n" << run.out << run.err;
    EXPECT_EQ(run.out, "") << op << ": a header was printed before the error";
    EXPECT_NE(run.err.find(dir.file("zinf-io.dat")), std::string::npos) << run.err;
    EXPECT_NE(run.err.find(std::to_string(size) + " bytes"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("free"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << op << ": something was written";
  }
}

// 8 TiB on a 4 MiB tmpfs: refused up front (no std::bad_alloc, no half-written file).
TEST(CliIo, HugeSizeOnASmallFilesystemIsRefusedUpFront) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  zinf::testing::TmpfsMount mount(dir.path(), 4 << 20);
  if (!mount.ok()) GTEST_SKIP() << mount.why_not();
  ZinfRun run = run_zinf({"io", dir.path(), "--size", "8T", "--loops", "1", "--backend", "psync"});
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_EQ(run.err.find("bad_alloc"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("8796093022208 bytes"), std::string::npos) << run.err;
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
    EXPECT_EQ(run.exit_code, 2) << what << "\n" << run.out << run.err;
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
  EXPECT_EQ(folder.exit_code, 2) << folder.out << folder.err;
  EXPECT_NE(folder.err.find("read-only"), std::string::npos) << folder.err;
  EXPECT_EQ(folder.err.find("opening for writing"), std::string::npos) << folder.err;
  EXPECT_EQ(folder.out, "");
}

}  // namespace
}  // namespace zinf::tools
