// tools::Progress: the ETA and the plain lines of a fresh run and of a resumed one (a run
// loaded from a checkpoint starts past step 1).

#include "tools/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace zinf::tools {
namespace {

// A Progress off a terminal whose bar stream is a scratch file (plain lines go to stdout).
struct Plain {
  explicit Plain(int64_t total) : stream(std::tmpfile()), progress(total, stream, false, 10) {}
  ~Plain() { std::fclose(stream); }
  std::FILE* stream;
  Progress progress;
};

TEST(Progress, EtaOfAFreshRunIsTheMeanStepAfterTheFirstTimesTheStepsLeft) {
  Plain p(10);
  ::testing::internal::CaptureStdout();
  p.progress.update(1, 3.0, 100.0);
  EXPECT_FALSE(p.progress.eta_seconds().has_value()) << "one step says nothing of the rate";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.progress.update(2, 2.9, 100.0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(p.progress.eta_seconds().has_value());
  // 8 steps left at >= 50 ms each; far below a second on any machine that ran the sleep.
  EXPECT_GE(*p.progress.eta_seconds(), 0.4);
  EXPECT_LT(*p.progress.eta_seconds(), 8.0);
  EXPECT_NE(out.find("step 1/10"), std::string::npos) << out;
}

// A run resumed at step 4 of 8: its first update is step 5. The ETA counts from there (it
// was the time since the steady clock's epoch divided by 4, 8 hours and more, on a run
// with 3 steps left) and the first step gets its plain line.
TEST(Progress, AResumedRunTimesItsStepsFromTheFirstItTrains) {
  Plain p(8);
  ::testing::internal::CaptureStdout();
  p.progress.update(5, 5.9, 1000.0);
  EXPECT_FALSE(p.progress.eta_seconds().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.progress.update(6, 6.0, 1000.0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(p.progress.eta_seconds().has_value());
  EXPECT_GE(*p.progress.eta_seconds(), 0.1);  // 2 steps left at >= 50 ms each
  EXPECT_LT(*p.progress.eta_seconds(), 2.0);
  EXPECT_NE(out.find("step 5/8"), std::string::npos) << out;
}

}  // namespace
}  // namespace zinf::tools
