// `zinf io` pins a bounded ring of buffers, not the whole --size, and still checks every
// byte; sizes the engine cannot honour are errors before any I/O.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tests/common/temp_dir.h"
#include "tests/tools/file_bytes.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

class IoJobRingTest : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  // A job whose ring is far smaller than its size: 4 KiB blocks, queue depth 1, 3 threads.
  IoJob small_ring_job(uint64_t bytes, bool write) {
    IoJob j;
    j.path = dir_.file("ring.dat");
    j.size_bytes = bytes;
    j.write = write;
    j.loops = 2;
    j.validate = true;
    j.overwrite = true;
    j.aio.backend = GetParam();
    j.aio.block_size = 4096;
    j.aio.queue_depth = 1;
    j.aio.intra_op_parallelism = 3;
    return j;
  }
  zinf::testing::TempDir dir_;
};

TEST_P(IoJobRingTest, ValidatesEveryByteThroughASmallRing) {
  const uint64_t bytes = (uint64_t{3} << 20) + 7;
  IoJobResult w = run_io_job(small_ring_job(bytes, true));
  EXPECT_TRUE(w.validated);
  EXPECT_LT(w.pinned_bytes, uint64_t{1} << 20);
  EXPECT_GE(w.pinned_bytes, uint64_t{4096});
  IoJobResult r = run_io_job(small_ring_job(bytes, false));
  EXPECT_TRUE(r.validated);
  EXPECT_EQ(zinf::testing::read_file(dir_.file("ring.dat")).size(), bytes);

  // One byte changed far beyond the ring between two loops is found, at its offset.
  const uint64_t bad = (uint64_t{2} << 20) + 12345;
  auto corrupt = [&](int loop, const IoLoop&) {
    if (loop != 0) return;
    std::fstream f(dir_.file("ring.dat"), std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(static_cast<std::streamoff>(bad));
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(bad));
    f.write(&c, 1);
  };
  try {
    (void)run_io_job(small_ring_job(bytes, false), corrupt);
    ADD_FAILURE() << "a changed byte passed validation";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
  }
}

TEST_P(IoJobRingTest, PlansABoundedRingForAHugeSize) {
  // A read of a sparse 8 TiB file: a write of 8 TiB would be refused for want of space.
  const std::string huge = dir_.file("huge.dat");
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, uint64_t{8} << 40);
  IoJob j = small_ring_job(uint64_t{8} << 40, false);
  j.path = huge;
  j.validate = false;
  j.aio.block_size = 1 << 20;
  j.aio.queue_depth = 8;
  j.aio.intra_op_parallelism = 2;
  IoPlan plan = plan_io_job(j);
  // The ring is what the engine keeps in flight (1M x 8 x 2), in 4 chunks.
  EXPECT_EQ(plan.chunk_bytes, uint64_t{4} << 20);
  EXPECT_EQ(plan.ring_bytes, plan.chunk_bytes * static_cast<uint64_t>(plan.ring_slots));
  EXPECT_EQ(plan.ring_bytes, uint64_t{16} << 20);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoJobRingTest,
                         ::testing::Values(aio::BackendKind::kIoUring, aio::BackendKind::kLibaio,
                                           aio::BackendKind::kPsync),
                         [](const auto& p) { return std::string(aio::to_string(p.param)); });

}  // namespace
}  // namespace zinf::tools
