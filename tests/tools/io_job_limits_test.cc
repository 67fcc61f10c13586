// Inputs the engine cannot honour are errors before any I/O, not silently changed.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zinf::tools
