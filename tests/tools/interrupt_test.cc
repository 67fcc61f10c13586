// SIGINT/SIGTERM inside an InterruptScope only set a flag; a job sees it between requests,
// drains what is in flight, removes its own file and throws Interrupted.
#include "tools/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <string>

#include "tests/common/temp_dir.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

TEST(Interrupt, SignalMidJobDrainsAndRemovesTheFile) {
  for (int sig : {SIGINT, SIGTERM}) {
    zinf::testing::TempDir dir;
    ASSERT_TRUE(dir.ok());
    IoJob job;
    job.path = dir.path();
    job.size_bytes = (uint64_t{4} << 20) + 3;
    job.loops = 1000;
    job.aio.block_size = 4096;
    job.aio.queue_depth = 4;
    job.aio.intra_op_parallelism = 2;
    job.aio.backend = aio::BackendKind::kPsync;
    int loops_seen = 0;
    InterruptScope scope;
    try {
      (void)run_io_job(job, [&](int i, const IoLoop&) {
        loops_seen = i + 1;
        if (i == 1) ::raise(sig);  // the handler only sets the flag
      });
      ADD_FAILURE() << "the job ran to the end";
    } catch (const Interrupted& e) {
      EXPECT_EQ(e.signal_number(), sig);
      EXPECT_NE(std::string(e.what()).find("loop 3 of 1000"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("removed"), std::string::npos) << e.what();
    }
    EXPECT_EQ(loops_seen, 2);
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "zinf-io.dat left behind";
    EXPECT_EQ(interrupt_signal(), sig);
  }
}

TEST(Interrupt, ScopeClearsTheFlag) {
  set_interrupt_for_testing(SIGINT);
  InterruptScope scope;
  EXPECT_EQ(interrupt_signal(), 0);
  EXPECT_NO_THROW(throw_if_interrupted("nothing"));
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

}  // namespace
}  // namespace zinf::tools
