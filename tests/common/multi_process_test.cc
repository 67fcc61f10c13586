// Tests of the multi-rank launcher's verdicts (tests/common/multi_process.h): a rank counts as
// passed only with the "[       OK ]" line of the test it was asked to run, so a filter that
// matches nothing (GoogleTest exits 0) or a test body that leaves through exit(0) is reported,
// and a fault test's "expected to fail" wants the test's "[  FAILED  ]" line. The rank bodies
// are DISABLED_ tests of this executable that run_ranks starts.
#include "tests/common/multi_process.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace zinf::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// Rank bodies (run only inside ranks started by run_ranks)

TEST(MultiProcessRank, DISABLED_Passes) {
  const char* rank = std::getenv("RANK");
  const char* child = std::getenv(kChildRankVariable);
  ASSERT_TRUE(rank != nullptr && child != nullptr) << "run only by run_ranks";
  EXPECT_EQ(std::atoi(rank), std::atoi(child));
}

TEST(MultiProcessRank, DISABLED_Fails) { ADD_FAILURE() << "failing on purpose"; }

TEST(MultiProcessRank, DISABLED_Skips) { GTEST_SKIP() << "skipping on purpose"; }

// Leaves the test halfway, as a library calling exit(0) would: status 0, no result line.
TEST(MultiProcessRank, DISABLED_ExitsZero) { std::exit(0); }

// ---------------------------------------------------------------------------------------------
// Launching tests

std::vector<RankResult> launch(const std::string& test, int world = 2) {
  RanksOptions o;
  o.world_size = world;
  o.test = test;
  o.deadline = std::chrono::seconds(30);
  return run_ranks(o);
}

TEST(MultiProcess, RanksThatRanTheirTestPass) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_Passes");
  ASSERT_EQ(results.size(), 2u);
  for (const RankResult& r : results) {
    EXPECT_EQ(r.test, "MultiProcessRank.DISABLED_Passes");
    EXPECT_TRUE(rank_passed(r));
    EXPECT_TRUE(r.passed());
    EXPECT_FALSE(rank_failed(r));
  }
  expect_ranks_passed(results);
}

// The gap this helper closes: a renamed rank body leaves a filter that matches no test, and
// GoogleTest exits 0 having run nothing.
TEST(MultiProcess, AFilterMatchingNoTestIsNotAPass) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_RenamedAway");
  ASSERT_EQ(results.size(), 2u);
  for (const RankResult& r : results) {
    ASSERT_TRUE(r.exited) << describe(r);
    ASSERT_EQ(r.exit_code, 0) << describe(r);  // what an exit-status check alone accepted
    const ::testing::AssertionResult verdict = rank_passed(r);
    EXPECT_FALSE(verdict);
    EXPECT_NE(std::string(verdict.message()).find("no test matched the filter"), std::string::npos)
        << verdict.message();
    EXPECT_FALSE(r.passed());
    EXPECT_FALSE(rank_failed(r));
  }
  // One rank: EXPECT_NONFATAL_FAILURE wants exactly one failure.
  EXPECT_NONFATAL_FAILURE(
      expect_ranks_passed({results[1]}),
      "rank 1 exited 0 without a \"[       OK ] MultiProcessRank.DISABLED_RenamedAway");
}

TEST(MultiProcess, ATestLeftThroughExitZeroIsNotAPass) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_ExitsZero", 1);
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].exited && results[0].exit_code == 0) << describe(results[0]);
  EXPECT_FALSE(rank_passed(results[0]));
  EXPECT_FALSE(rank_failed(results[0]));
}

TEST(MultiProcess, AFailedTestIsAFailureNotAPass) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_Fails");
  ASSERT_EQ(results.size(), 2u);
  for (const RankResult& r : results) {
    EXPECT_FALSE(rank_passed(r));
    EXPECT_TRUE(rank_failed(r));
  }
  EXPECT_NONFATAL_FAILURE(expect_ranks_passed({results[1]}), "rank 1 exited 1");
}

TEST(MultiProcess, ASkipPassesOnlyWhenTheCallerAllowsIt) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_Skips", 1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(rank_passed(results[0]));
  EXPECT_TRUE(rank_passed(results[0], SkipPolicy::kPasses));
  EXPECT_FALSE(rank_failed(results[0]));
}

// A pattern runs several tests or none; it has no single result line to look for.
TEST(MultiProcess, APatternInsteadOfOneTestIsRefused) {
  if (is_child_rank()) {
    GTEST_SKIP() << "launching test inside a rank";
  }
  const std::vector<RankResult> results = launch("MultiProcessRank.DISABLED_Pass*", 1);
  ASSERT_EQ(results.size(), 1u);
  const ::testing::AssertionResult verdict = rank_passed(results[0]);
  EXPECT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("is a pattern"), std::string::npos)
      << verdict.message();
}

// ---------------------------------------------------------------------------------------------
// Verdicts on results made up here

RankResult made_up(const std::string& test, int exit_code, const std::string& output) {
  RankResult r;
  r.rank = 0;
  r.test = test;
  r.exited = true;
  r.exit_code = exit_code;
  r.output = output;
  return r;
}

TEST(MultiProcess, TheResultLineMustNameTheWholeTest) {
  EXPECT_TRUE(has_result_line("[       OK ] S.T (3 ms)\n", "[       OK ] ", "S.T"));
  EXPECT_TRUE(has_result_line("[       OK ] S.T", "[       OK ] ", "S.T"));
  EXPECT_TRUE(has_result_line("x\n[       OK ] S.T\n", "[       OK ] ", "S.T"));
  EXPECT_FALSE(has_result_line("[       OK ] S.T2 (3 ms)\n", "[       OK ] ", "S.T"));
  EXPECT_FALSE(has_result_line("[ RUN      ] S.T\n", "[       OK ] ", "S.T"));
  // The first occurrence is another test's; the second is this one's.
  EXPECT_TRUE(has_result_line("[       OK ] S.T2 (1 ms)\n[       OK ] S.T (3 ms)\n",
                              "[       OK ] ", "S.T"));

  EXPECT_FALSE(rank_passed(made_up("S.T", 0, "[       OK ] S.T2 (3 ms)\n")));
  EXPECT_TRUE(rank_passed(made_up("S.T", 0, "[       OK ] S.T (3 ms)\n")));
  // An OK line is not enough when the rank then failed (a crash at exit, a later failure).
  EXPECT_FALSE(rank_passed(made_up("S.T", 1, "[       OK ] S.T (3 ms)\n")));
}

TEST(MultiProcess, KilledAndTimedOutRanksNeitherPassNorFailTheirTest) {
  RankResult killed = made_up("S.T", -1, "[ RUN      ] S.T\n");
  killed.exited = false;
  killed.signal = 9;
  EXPECT_FALSE(rank_passed(killed));
  EXPECT_FALSE(rank_failed(killed));
  RankResult late = killed;
  late.timed_out = true;
  EXPECT_FALSE(rank_passed(late));
  EXPECT_FALSE(rank_failed(late));
  RankResult never = made_up("S.T", -1, "");
  never.exited = false;
  const ::testing::AssertionResult verdict = rank_passed(never);
  EXPECT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("was not started"), std::string::npos)
      << verdict.message();
}

}  // namespace
}  // namespace zinf::testing
