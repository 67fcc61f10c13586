#include "tools/io_job.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

namespace zinf::tools {
namespace {

class IoJobTest : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zinf-io-job-test.XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  IoJob job(uint64_t bytes, bool write) {
    IoJob j;
    j.path = dir_;
    j.size_bytes = bytes;
    j.write = write;
    j.loops = 2;
    j.validate = true;
    j.aio.backend = GetParam();
    j.aio.intra_op_parallelism = 3;
    return j;
  }
  std::string dir_;
};

TEST_P(IoJobTest, WriteAndReadValidateOddSizes) {
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4095}, (uint64_t{3} << 20) + 7}) {
    IoJobResult w = run_io_job(job(bytes, true));
    EXPECT_TRUE(w.validated);
    EXPECT_TRUE(w.direct_io);
    ASSERT_EQ(w.loops.size(), 2u);
    EXPECT_GT(w.median.gb_per_s, 0);
    IoJobResult r = run_io_job(job(bytes, false));
    EXPECT_TRUE(r.validated);
    EXPECT_TRUE(r.prepared_file);
    EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "zinf-io.dat left behind";
  }
}

TEST_P(IoJobTest, ExplicitFileIsKept) {
  IoJob j = job(1 << 20, true);
  j.path = dir_ + "/mine.dat";
  IoJobResult r = run_io_job(j);
  EXPECT_EQ(r.file, j.path);
  struct stat st{};
  ASSERT_EQ(::stat(j.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
}

TEST_P(IoJobTest, TmpfsFallsBackToBufferedAndSaysSo) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  char name[] = "/dev/shm/zinf-io-job-test.XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  IoJob j = job(1 << 20, true);
  j.path = name;
  IoJobResult r = run_io_job(j);
  std::filesystem::remove_all(name);
  EXPECT_FALSE(r.direct_io);
  EXPECT_TRUE(r.validated);
}

TEST_P(IoJobTest, MissingFolderIsNamed) {
  IoJob j = job(4096, true);
  j.path = dir_ + "/no/such/dir/file.dat";
  try {
    run_io_job(j);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/no/such/dir"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, IoJobTest,
                         ::testing::Values(aio::BackendKind::kIoUring, aio::BackendKind::kLibaio,
                                           aio::BackendKind::kPsync),
                         [](const auto& info) { return std::string(aio::to_string(info.param)); });

}  // namespace
}  // namespace zinf::tools
