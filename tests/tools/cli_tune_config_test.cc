// `zinf nvme-tune --write-config FILE` checks FILE with the config parser's rules before
// the first run, changes only the text of its `aio` block, and creates a missing FILE only
// when asked (--create).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/tools/file_bytes.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

using zinf::testing::run_zinf;
using zinf::testing::ZinfRun;

class CliTuneConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    ASSERT_TRUE(std::filesystem::create_directory(dir_.file("drive")));
  }
  // One quick tuning run (the budget stops the search after it).
  ZinfRun tune(const std::string& config, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"nvme-tune",      dir_.file("drive"),
                                     "--size",         "64K",
                                     "--backend",      "psync",
                                     "--budget",       "0.001",
                                     "--loops",        "1",
                                     "--write-config", config};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_zinf(args);
  }
  zinf::testing::TempDir dir_;
};

TEST_F(CliTuneConfig, BadConfigIsRefusedBeforeTheFirstRun) {
  struct Case {
    std::string text;
    std::vector<std::string> expected;  // in the error
  };
  const std::vector<Case> cases = {
      {R"({"aio": {"queue_dept": 8}})", {"aio.queue_dept", "queue_depth"}},
      {R"({"aio": {"use_gds": true}})", {"aio.use_gds"}},
      {R"({"aio": {"queue_depth": "eight"}})", {"aio.queue_depth", "eight"}},
      {R"({"aio": {"block_size": 1048576},)", {"not valid JSON"}},
  };
  for (const Case& c : cases) {
    std::string path = dir_.file("ds_config.json");
    std::ofstream(path, std::ios::trunc) << c.text;
    ZinfRun run = tune(path);
    EXPECT_EQ(run.exit_code, 2) << c.text << "\n" << run.out << run.err;
    EXPECT_EQ(run.out.find("[ 1/"), std::string::npos) << c.text << ": a run was made\n" << run.out;
    for (const std::string& e : c.expected) {
      EXPECT_NE(run.err.find(e), std::string::npos) << c.text << ": no '" << e << "' in\n"
                                                    << run.err;
    }
    EXPECT_EQ(zinf::testing::read_file(path), c.text) << "the file was changed";
  }
}

TEST_F(CliTuneConfig, OnlyTheAioBlockChanges) {
  const std::string before =
      "{\n  \"train_batch_size\": 8,\n  \"optimizer\": {\"type\": \"AdamW\", \"params\": "
      "{\"lr\": 1e-4, \"eps\": 1e-8}},\n  \"aio\": ";
  const std::string old_block = "{\"block_size\": 4096,\n         \"queue_depth\": 4}";
  const std::string after =
      ",\n  \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 1e8}\n}\n";
  std::string path = dir_.file("ds_config.json");
  std::ofstream(path, std::ios::trunc) << before << old_block << after;
  ZinfRun run = tune(path);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  std::string text = zinf::testing::read_file(path);
  ASSERT_GE(text.size(), before.size() + after.size()) << text;
  EXPECT_EQ(text.substr(0, before.size()), before) << text;
  EXPECT_EQ(text.substr(text.size() - after.size()), after) << text;
  std::string block = text.substr(before.size(), text.size() - before.size() - after.size());
  EXPECT_NE(block.find("\"intra_op_parallelism\""), std::string::npos) << block;
  EXPECT_NE(block.find("\"backend\": \"psync\""), std::string::npos) << block;
}

TEST_F(CliTuneConfig, MissingFileIsCreatedOnlyWithCreate) {
  std::string path = dir_.file("new.json");
  ZinfRun refused = tune(path);
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("--create"), std::string::npos) << refused.err;
  EXPECT_EQ(refused.out.find("[ 1/"), std::string::npos) << refused.out;
  EXPECT_FALSE(std::filesystem::exists(path));

  ZinfRun created = tune(path, {"--create"});
  EXPECT_EQ(created.exit_code, 0) << created.out << created.err;
  EXPECT_NE(zinf::testing::read_file(path).find("\"aio\""), std::string::npos);
}

}  // namespace
}  // namespace zinf::tools
