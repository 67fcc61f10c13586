// SIGINT/SIGTERM end `zinf io` and `zinf nvme-tune` cleanly: in-flight I/O drained, the
// temporary file removed, exit 128 + signal with one line saying what was interrupted.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

using zinf::testing::run_zinf;
using zinf::testing::ZinfRun;

// True once `out` holds a line after the table header of `zinf io` (the first timed loop).
bool first_loop_printed(const std::string& out) {
  size_t header = out.find("GiB/s\n");
  return header != std::string::npos && out.find('\n', header + 6) != std::string::npos;
}

void expect_one_interrupt_line(const ZinfRun& run, const std::string& signal_name) {
  EXPECT_NE(run.err.find("interrupted by " + signal_name), std::string::npos) << run.err;
  size_t lines = 0;
  for (char c : run.err) lines += c == '\n' ? 1 : 0;
  EXPECT_EQ(lines, 1u) << run.err;
}

TEST(CliSignal, IoEndsCleanlyOnSigintAndSigterm) {
  for (int sig : {SIGINT, SIGTERM}) {
    zinf::testing::TempDir dir;
    ASSERT_TRUE(dir.ok());
    ZinfRun run = run_zinf({"io", dir.path(), "--size", "32M", "--loops", "100000", "--backend",
                            "psync", "--validate"},
                           first_loop_printed, sig);
    ASSERT_TRUE(run.signal_sent) << run.out << run.err;
    EXPECT_FALSE(run.timed_out);
    EXPECT_EQ(run.term_signal, 0) << "killed by signal " << run.term_signal;
    EXPECT_EQ(run.exit_code, 128 + sig) << run.out << run.err;
    expect_one_interrupt_line(run, sig == SIGINT ? "SIGINT" : "SIGTERM");
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "zinf-io.dat left behind";
  }
}

TEST(CliSignal, NvmeTuneEndsCleanlyOnSigint) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  ZinfRun run =
      run_zinf({"nvme-tune", dir.path(), "--size", "16M", "--backend", "psync"},
               [](const std::string& out) { return out.find("[ 1/") != std::string::npos; });
  ASSERT_TRUE(run.signal_sent) << run.out << run.err;
  EXPECT_EQ(run.term_signal, 0) << "killed by signal " << run.term_signal;
  EXPECT_EQ(run.exit_code, 130) << run.out << run.err;
  expect_one_interrupt_line(run, "SIGINT");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "zinf-io.dat left behind";
}

}  // namespace
}  // namespace zinf::tools
