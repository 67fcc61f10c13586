// Inputs the engine cannot honour are errors before any I/O, not silently changed: a block
// size above the engine's cap, a size the target's filesystem has no room for.
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "aio/backend.h"
#include "tests/common/temp_dir.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

TEST(IoJobLimits, BlockSizeAboveTheEnginesCapIsAnError) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  IoJob j;
  j.path = dir.path();
  j.size_bytes = 4096;
  j.loops = 1;
  j.aio.block_size = uint64_t{aio::kMaxRequestBytes} * 2;
  try {
    (void)run_io_job(j);
    ADD_FAILURE() << "a 2 GiB block size was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1 GiB"), std::string::npos) << e.what();
  }
}

uint64_t free_bytes(const std::string& folder) {
  struct statvfs vfs {};
  EXPECT_EQ(::statvfs(folder.c_str(), &vfs), 0) << folder;
  return static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
}

// What a job adds to the filesystem is checked against its free space before any I/O: 1 GiB
// more than the temp folder's free space is refused (write, and a read that writes its data
// first), naming the file and both byte counts; an existing file's bytes count as room. Only
// planned here (no job runs: without the check it would fill the drive); cli_io_test runs
// one under a file-size limit.
TEST(IoJobLimits, SizeBeyondTheFreeSpaceIsRefusedBeforeAnyWrite) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t size = free_bytes(dir.path()) + (uint64_t{1} << 30);
  for (const bool write : {true, false}) {
    IoJob j;
    j.path = dir.path();
    j.size_bytes = size;
    j.write = write;
    j.loops = 1;
    j.aio.backend = aio::BackendKind::kPsync;
    try {
      (void)plan_io_job(j);
      ADD_FAILURE() << (write ? "write" : "read") << " of " << size << " bytes was planned";
    } catch (const NotEnoughSpace& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(dir.file("zinf-io.dat")), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(size) + " bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("free"), std::string::npos) << what;
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  }

  // An existing (sparse) file of 2 GiB already holds 2 GiB of the job's bytes.
  const std::string existing = dir.file("existing.dat");
  std::ofstream(existing).close();
  std::filesystem::resize_file(existing, uint64_t{2} << 30);
  IoJob j;
  j.path = existing;
  j.size_bytes = size;
  j.overwrite = true;
  j.aio.backend = aio::BackendKind::kPsync;
  const IoPlan plan = plan_io_job(j);
  EXPECT_EQ(plan.grow_bytes, size - (uint64_t{2} << 30));
}

}  // namespace
}  // namespace zinf::tools
