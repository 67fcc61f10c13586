#include "tools/io_job.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "aio/file_cache.h"
#include "tests/common/temp_dir.h"

namespace zinf::tools {
namespace {

class IoJobTest : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  IoJob job(uint64_t bytes, bool write) {
    IoJob j;
    j.path = dir_.path();
    j.size_bytes = bytes;
    j.write = write;
    j.loops = 2;
    j.validate = true;
    j.aio.backend = GetParam();
    j.aio.intra_op_parallelism = 3;
    return j;
  }
  zinf::testing::TempDir dir_;
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
    EXPECT_TRUE(std::filesystem::is_empty(dir_.path())) << "zinf-io.dat left behind";
  }
}

TEST_P(IoJobTest, RegistersItsBufferOnIoUringOnly) {
  IoJob j = job(4 << 20, true);
  j.validate = false;
  IoJobResult r = run_io_job(j);
  EXPECT_GT(r.stats.requests, 0u);
  if (GetParam() == aio::BackendKind::kIoUring) {
    EXPECT_TRUE(r.registered_buffer);
    EXPECT_EQ(r.stats.fixed_requests, r.stats.requests);
  } else {
    EXPECT_FALSE(r.registered_buffer);
    EXPECT_EQ(r.stats.fixed_requests, 0u);
  }
  j.register_buffer = false;
  IoJobResult plain = run_io_job(j);
  EXPECT_FALSE(plain.registered_buffer);
  EXPECT_EQ(plain.stats.fixed_requests, 0u);
}

TEST_P(IoJobTest, ExplicitFileIsKept) {
  IoJob j = job(1 << 20, true);
  j.path = dir_.file("mine.dat");
  IoJobResult r = run_io_job(j);
  EXPECT_EQ(r.file, j.path);
  struct stat st {};
  ASSERT_EQ(::stat(j.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
}

// tmpfs accepts O_DIRECT since Linux 6.6, so the refusal is simulated through aio's open
// seam for paths containing "nodirect"; the job must still validate and must say so.
TEST_P(IoJobTest, RefusedODirectFallsBackToBufferedAndSaysSo) {
  aio::set_open_function_for_testing([](const char* path, int flags, unsigned mode) -> int {
    if ((flags & O_DIRECT) != 0 && std::string_view(path).find("nodirect") != std::string::npos) {
      return -EINVAL;
    }
    int fd = ::open(path, flags, mode);
    return fd >= 0 ? fd : -errno;
  });
  struct Restore {
    ~Restore() { aio::set_open_function_for_testing(nullptr); }
  } restore;
  IoJob j = job(1 << 20, true);
  j.path = dir_.file("nodirect.dat");
  IoJobResult r = run_io_job(j);
  EXPECT_FALSE(r.direct_io);
  EXPECT_TRUE(r.validated);
  j.path = dir_.file("direct.dat");
  EXPECT_TRUE(run_io_job(j).direct_io);
}

TEST_P(IoJobTest, MissingFolderIsNamed) {
  IoJob j = job(4096, true);
  j.path = dir_.file("no/such/dir/file.dat");
  try {
    run_io_job(j);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir_.file("no/such/dir")), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, IoJobTest,
                         ::testing::Values(aio::BackendKind::kIoUring, aio::BackendKind::kLibaio,
                                           aio::BackendKind::kPsync),
                         [](const auto& p) { return std::string(aio::to_string(p.param)); });

}  // namespace
}  // namespace zinf::tools
