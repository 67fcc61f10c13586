#include "tools/nvme_tune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <tuple>

#include "tests/common/temp_dir.h"
#include "tests/tools/test_system.h"
#include "tools/aio_config_json.h"

namespace zinf::tools {
namespace {

// A model drive: throughput peaks at one grid point and falls off with the distance from
// it in every dimension, so a search that explores badly picks a worse point.
TuneRun model_drive(const aio::AioConfig& c) {
  double score = 10.0;
  score -= c.block_size == (8u << 20) ? 0.0 : 1.5;
  score -= std::abs(std::log2(c.intra_op_parallelism) - 2.0) * 1.0;  // best at 4
  score -= c.queue_depth == 128 ? 0.0 : 0.4;
  score -= c.overlap_events ? 0.0 : 0.8;
  score -= c.single_submit ? 0.3 : 0.0;
  TuneRun run;
  run.config = c;
  run.read_gb_per_s = score * 0.6;
  run.write_gb_per_s = score * 0.4;
  run.seconds = 0.01;
  return run;
}

TEST(NvmeTune, FindsTheBestPointInFarFewerRunsThanTheGrid) {
  TuneOptions options;
  options.folder = "/unused";
  int progress_calls = 0;
  TuneResult r = run_nvme_tune(options, model_drive, [&](int i, int planned, const TuneRun&) {
    ++progress_calls;
    EXPECT_EQ(i, progress_calls);
    EXPECT_LE(i, planned);
  });
  EXPECT_EQ(r.best.config.block_size, 8u << 20);
  EXPECT_EQ(r.best.config.intra_op_parallelism, 4);
  EXPECT_EQ(r.best.config.queue_depth, 128);
  EXPECT_TRUE(r.best.config.overlap_events);
  EXPECT_FALSE(r.best.config.single_submit);
  EXPECT_LE(r.runs.size(), 17u);
  EXPECT_LT(static_cast<int>(r.runs.size()), TuneResult::kFullGridRuns);
  EXPECT_EQ(progress_calls, static_cast<int>(r.runs.size()));
  EXPECT_FALSE(r.budget_exhausted);
  // No configuration is measured twice.
  std::set<std::tuple<uint64_t, int, int, bool, bool>> seen;
  for (const TuneRun& run : r.runs) {
    EXPECT_TRUE(seen.emplace(run.config.block_size, run.config.queue_depth,
                             run.config.intra_op_parallelism, run.config.single_submit,
                             run.config.overlap_events)
                    .second);
  }
}

TEST(NvmeTune, BudgetStopsTheSearchAndKeepsTheBestSoFar) {
  TuneOptions options;
  options.folder = "/unused";
  options.budget_seconds = 5;
  TuneResult r = run_nvme_tune(options, [](const aio::AioConfig& c) {
    TuneRun run = model_drive(c);
    run.seconds = 10;  // longer than the whole budget: no second run may start
    return run;
  });
  EXPECT_EQ(r.runs.size(), 1u);
  EXPECT_TRUE(r.budget_exhausted);
  EXPECT_GT(r.best.score(), 0);
}

TEST(NvmeTune, BestBlockParsesAsConfig) {
  TuneOptions options;
  options.folder = "/unused";
  TuneResult r = run_nvme_tune(options, model_drive);
  nlohmann::ordered_json root;
  root["aio"] = aio_config_to_json(r.best.config);
  aio::AioConfig parsed = aio_config_from_json(nlohmann::ordered_json::parse(root.dump(2)));
  EXPECT_EQ(parsed.block_size, r.best.config.block_size);
  EXPECT_EQ(parsed.intra_op_parallelism, r.best.config.intra_op_parallelism);
  EXPECT_EQ(parsed.queue_depth, r.best.config.queue_depth);
}

TEST(NvmeTune, RealDiskSmokeRun) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  TuneOptions options;
  options.folder = dir.path();
  options.size_bytes = 2u << 20;
  TuneResult r = run_nvme_tune(options);
  EXPECT_GE(r.runs.size(), 15u);
  for (const TuneRun& run : r.runs) {
    EXPECT_GT(run.read_gb_per_s, 0);
    EXPECT_GT(run.write_gb_per_s, 0);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the tuner left files behind";
}

// A drive that fills up in the middle of the first run: the run fails, and no zinf-io.dat
// (which the write direction keeps for the read direction) is left behind.
TEST(NvmeTune, FullFilesystemLeavesNoFile) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  zinf::testing::TmpfsMount mount(dir.path(), 1 << 20);
  if (!mount.ok()) GTEST_SKIP() << mount.why_not();
  TuneOptions options;
  options.folder = dir.path();
  options.size_bytes = 2u << 20;
  options.backend = aio::BackendKind::kPsync;
  EXPECT_THROW((void)run_nvme_tune(options), std::exception);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the tuner left zinf-io.dat behind";
}

}  // namespace
}  // namespace zinf::tools
