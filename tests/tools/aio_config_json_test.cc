#include "tools/aio_config_json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace zinf::tools {
namespace {

using Json = nlohmann::ordered_json;

std::string error_of(const std::string& text) {
  try {
    (void)aio_config_from_json(Json::parse(text));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(AioConfigJson, DefaultsWhenAbsent) {
  aio::AioConfig c = aio_config_from_json(Json::parse(R"({"train_batch_size": 8})"));
  EXPECT_EQ(c.block_size, 1u << 20);
  EXPECT_EQ(c.queue_depth, 8);
  EXPECT_EQ(c.intra_op_parallelism, 1);
  EXPECT_FALSE(c.single_submit);
  EXPECT_TRUE(c.overlap_events);
  EXPECT_EQ(c.backend, aio::BackendKind::kIoUring);
}

TEST(AioConfigJson, ParsesTheSharedNvmeExample) {
  std::ifstream in(std::filesystem::path(ZINF_SHARED_DIR) / "examples" / "zero3_nvme.json");
  if (!in) GTEST_SKIP() << "shared/examples not found at " << ZINF_SHARED_DIR;
  std::stringstream text;
  text << in.rdbuf();
  aio::AioConfig c = aio_config_from_json(Json::parse(text.str()));
  EXPECT_EQ(c.block_size, 1048576u);
  EXPECT_EQ(c.queue_depth, 8);
  EXPECT_EQ(c.intra_op_parallelism, 1);
  EXPECT_TRUE(c.overlap_events);
}

TEST(AioConfigJson, ThreadCountAliasAndExponents) {
  aio::AioConfig c = aio_config_from_json(Json::parse(
      R"({"aio": {"block_size": 8.388608e6, "thread_count": 4, "queue_depth": 32,
                  "single_submit": true, "overlap_events": false, "backend": "libaio"}})"));
  EXPECT_EQ(c.block_size, 8388608u);
  EXPECT_EQ(c.intra_op_parallelism, 4);
  EXPECT_EQ(c.queue_depth, 32);
  EXPECT_TRUE(c.single_submit);
  EXPECT_FALSE(c.overlap_events);
  EXPECT_EQ(c.backend, aio::BackendKind::kLibaio);
}

TEST(AioConfigJson, ErrorsNameTheKey) {
  EXPECT_NE(error_of(R"({"aio": {"queue_depht": 8}})").find("aio.queue_depht"), std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"queue_depth": 0}})").find("aio.queue_depth"), std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"block_size": 1.5e3}})").find("aio.block_size"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"single_submit": "yes"}})").find("aio.single_submit"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"backend": "spdk"}})").find("aio.backend"), std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"use_gds": true}})").find("aio.use_gds"), std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"thread_count": 2, "intra_op_parallelism": 4}})")
                .find("intra_op_parallelism"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"aio": {"block_size": 1000}})").find("block_size"), std::string::npos);
}

TEST(AioConfigJson, RoundTripsThroughTheEmittedBlock) {
  aio::AioConfig c;
  c.block_size = 8 << 20;
  c.queue_depth = 128;
  c.intra_op_parallelism = 2;
  c.single_submit = true;
  c.overlap_events = false;
  c.backend = aio::BackendKind::kPsync;
  Json root;
  root["aio"] = aio_config_to_json(c);
  aio::AioConfig back = aio_config_from_json(Json::parse(root.dump()));
  EXPECT_EQ(back.block_size, c.block_size);
  EXPECT_EQ(back.queue_depth, c.queue_depth);
  EXPECT_EQ(back.intra_op_parallelism, c.intra_op_parallelism);
  EXPECT_EQ(back.single_submit, c.single_submit);
  EXPECT_EQ(back.overlap_events, c.overlap_events);
  EXPECT_EQ(back.backend, c.backend);
}

std::string error_of_missing(const std::string& path) {
  try {
    (void)check_config_for_aio_block(path, false);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

class WriteAioBlock : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  zinf::testing::TempDir dir_;
};

TEST_F(WriteAioBlock, ReplacesOnlyTheAioBlockAndKeepsKeyOrder) {
  std::string path = dir_.file("ds_config.json");
  {
    std::ofstream out(path);
    out << R"({"train_batch_size": 8, "aio": {"block_size": 4096}, "zero_optimization": {"stage": 3}})";
  }
  aio::AioConfig c;
  c.queue_depth = 32;
  write_aio_block(path, c, false);
  std::ifstream in(path);
  Json root = Json::parse(in);
  ASSERT_TRUE(root.is_object());
  auto it = root.begin();
  EXPECT_EQ(it.key(), "train_batch_size");
  EXPECT_EQ((++it).key(), "aio");
  EXPECT_EQ((++it).key(), "zero_optimization");
  EXPECT_EQ(root["zero_optimization"]["stage"], 3);
  EXPECT_EQ(aio_config_from_json(root).queue_depth, 32);
  EXPECT_FALSE(std::filesystem::exists(path + ".zinf-tmp"));
}

TEST_F(WriteAioBlock, LeavesABrokenFileUntouched) {
  std::string path = dir_.file("broken.json");
  {
    std::ofstream out(path);
    out << "{ not json";
  }
  EXPECT_THROW(write_aio_block(path, aio::AioConfig{}, false), std::runtime_error);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "{ not json");
}

TEST_F(WriteAioBlock, CreatesAMissingFileOnlyWhenAsked) {
  std::string path = dir_.file("new.json");
  EXPECT_THROW(write_aio_block(path, aio::AioConfig{}, false), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(path));
  write_aio_block(path, aio::AioConfig{}, true);
  std::ifstream in(path);
  EXPECT_EQ(aio_config_from_json(Json::parse(in)).block_size, 1u << 20);
}

// Only the aio value's bytes change, whatever the layout; a missing block is added last.
TEST_F(WriteAioBlock, SplicesTheBlockIntoTheOriginalText) {
  aio::AioConfig c;
  c.queue_depth = 32;
  struct Case {
    std::string text;
    std::string kept;  // a piece of the original that must survive byte for byte
  };
  for (const Case& k : std::vector<Case>{
           {R"({"lr": 1e-4, "aio": {"block_size": 4096}, "n": 1e8})", R"({"lr": 1e-4, "aio": )"},
           {"{\n  \"lr\": 1e-4,\n  \"x\": [1, {\"aio\": 2}]\n}\n", "\"x\": [1, {\"aio\": 2}]"},
           {"{}", "{"},
           {"{\"s\": \"a \\\" } aio\", \"aio\": null}", "{\"s\": \"a \\\" } aio\", \"aio\": "},
       }) {
    std::string path = dir_.file("c.json");
    std::ofstream(path, std::ios::trunc) << k.text;
    (void)check_config_for_aio_block(path, false);  // unknown top-level keys: warnings only
    write_aio_block(path, c, false);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find(k.kept), std::string::npos) << k.text << " became " << text.str();
    EXPECT_EQ(aio_config_from_json(Json::parse(text.str())).queue_depth, 32) << text.str();
  }
}

TEST_F(WriteAioBlock, CheckRefusesWhatTheParserRefuses) {
  std::string path = dir_.file("c.json");
  auto error = [&](const std::string& text) -> std::string {
    std::ofstream(path, std::ios::trunc) << text;
    try {
      (void)check_config_for_aio_block(path, false);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error(R"({"aio": {"queue_dept": 8}})").find("did you mean \"queue_depth\""),
            std::string::npos);
  EXPECT_NE(error(R"({"aio": {"use_gds": true}})").find("aio.use_gds"), std::string::npos);
  EXPECT_NE(error(R"({"aio": {"queue_depth": "eight"}})").find("aio.queue_depth"),
            std::string::npos);
  EXPECT_NE(error(R"({"zero_optimization": {"stage": 9}})").find("zero_optimization.stage"),
            std::string::npos);
  EXPECT_NE(error("[1, 2]").find("top level"), std::string::npos);
  // Unknown keys outside the aio block stay warnings, as in training.
  std::ofstream(path, std::ios::trunc) << R"({"train_batch_sise": 8})";
  std::vector<std::string> warnings = check_config_for_aio_block(path, false);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("train_batch_sise"), std::string::npos);
  EXPECT_NE(error_of_missing(dir_.file("none.json")).find("--create"), std::string::npos);
}

}  // namespace
}  // namespace zinf::tools
