// `zinf io --read` never writes a byte the user did not ask for: block devices are sized
// with BLKGETSIZE64, a user's file that is too short is an error, and --validate (which
// writes a pattern first) needs --overwrite on anything that is not zinf's own file.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/tools/file_bytes.h"
#include "tests/tools/test_system.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

class IoJobDeviceTest : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  IoJob read_job(const std::string& path, uint64_t bytes) {
    IoJob j;
    j.path = path;
    j.size_bytes = bytes;
    j.write = false;
    j.loops = 2;
    j.aio.backend = GetParam();
    j.aio.intra_op_parallelism = 2;
    return j;
  }
  zinf::testing::TempDir dir_;
};

TEST_P(IoJobDeviceTest, ReadOfABlockDeviceLeavesItsBytesUnchanged) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  constexpr uint64_t kDeviceBytes = 8 << 20;
  std::string backing = dir_.file("disk.img");
  std::string before = zinf::testing::write_random_file(backing, kDeviceBytes, seed);
  zinf::testing::LoopDevice loop(backing);
  if (!loop.ok()) GTEST_SKIP() << loop.why_not();

  IoJobResult r = run_io_job(read_job(loop.device(), kDeviceBytes));
  EXPECT_FALSE(r.prepared_file);
  EXPECT_EQ(r.file, loop.device());
  ASSERT_EQ(r.loops.size(), 2u);

  // A read longer than the device is an error naming both sizes, not a write.
  try {
    (void)run_io_job(read_job(loop.device(), 2 * kDeviceBytes));
    ADD_FAILURE() << "a read past the end of the device was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(kDeviceBytes)), std::string::npos)
        << e.what();
  }
  // --validate would write the pattern over the device first: refused without --overwrite.
  IoJob validate = read_job(loop.device(), kDeviceBytes);
  validate.validate = true;
  EXPECT_THROW((void)run_io_job(validate), std::invalid_argument);

  loop.detach();
  EXPECT_TRUE(zinf::testing::read_file(backing) == before) << "the device's bytes changed";
}

TEST_P(IoJobDeviceTest, TooShortFileIsAnErrorAndStaysUnchanged) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::string path = dir_.file("mine.dat");
  std::string before = zinf::testing::write_random_file(path, (1 << 20) + 5, seed);
  try {
    (void)run_io_job(read_job(path, 2 << 20));
    ADD_FAILURE() << "a read longer than the file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string((1 << 20) + 5)), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(zinf::testing::read_file(path) == before) << "the file was changed";
  // A read that fits reads the user's bytes as they are.
  IoJobResult r = run_io_job(read_job(path, 1 << 20));
  EXPECT_FALSE(r.prepared_file);
  EXPECT_TRUE(zinf::testing::read_file(path) == before) << "the file was changed";
}

TEST_P(IoJobDeviceTest, ValidateOnAnExistingFileNeedsOverwrite) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::string path = dir_.file("mine.dat");
  std::string before = zinf::testing::write_random_file(path, 1 << 20, seed);
  IoJob j = read_job(path, 1 << 20);
  j.validate = true;
  try {
    (void)run_io_job(j);
    ADD_FAILURE() << "--validate overwrote an existing file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(zinf::testing::read_file(path) == before) << "the file was changed";
}

INSTANTIATE_TEST_SUITE_P(Backends, IoJobDeviceTest,
                         ::testing::Values(aio::BackendKind::kIoUring, aio::BackendKind::kLibaio,
                                           aio::BackendKind::kPsync),
                         [](const auto& p) { return std::string(aio::to_string(p.param)); });

}  // namespace
}  // namespace zinf::tools
