// A save over an existing tag folder: the previous checkpoint is replaced only when the folder
// holds nothing but checkpoint files (zinf never deletes a file it did not write), and
// `latest` moving back to an older step is said in a log line.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/temp_dir.h"
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
using zinf::testing::TempDir;

struct Trainer {
  explicit Trainer(std::vector<std::string>* lines) {
    EngineOptions o;
    o.zero.stage = 2;
    o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
    o.micro_batch_size = 2;
    o.tokens_per_sample = 8;
    o.steps_per_print = 0;
    o.memory_budget = 1ull << 30;
    o.log = [lines](const std::string& line) { lines->push_back(line); };
    model = std::make_shared<LlamaModelImpl>(testing::tiny_llama(16));
    engine = std::make_unique<Engine>(model, o);
  }
  void step() {
    engine->train_batch([&](int) {
      auto [x, y] = testing::arithmetic_batch(7, 2, 8);
      return model->loss(x, y);
    });
  }
  std::shared_ptr<LlamaModelImpl> model;
  std::unique_ptr<Engine> engine;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines) {
    if (l.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(CheckpointReplace, ATagFolderHoldingAForeignFileIsNotReplaced) {
  TempDir ck;
  ASSERT_TRUE(ck.ok());
  std::vector<std::string> lines;
  Trainer t(&lines);
  t.step();
  (void)t.engine->save_checkpoint(ck.path(), "mine");
  const std::string states = ck.path() + "/mine/" + model_states_file(2, 0);
  const std::string before = read_file(states);
  std::ofstream(ck.path() + "/mine/notes.txt") << "keep";
  t.step();
  try {
    (void)t.engine->save_checkpoint(ck.path(), "mine");
    FAIL() << "replaced a folder holding notes.txt";
  } catch (const EngineError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(ck.path() + "/mine: not replaced"), std::string::npos) << message;
    EXPECT_NE(message.find("notes.txt"), std::string::npos) << message;
  }
  EXPECT_EQ(read_file(states), before);
  EXPECT_EQ(read_file(ck.path() + "/mine/notes.txt"), "keep");
  EXPECT_FALSE(fs::exists(ck.path() + "/.mine.partial")) << "nothing staged";

  // Without it the tag is replaced, and only checkpoint files were removed.
  fs::remove(ck.path() + "/mine/notes.txt");
  (void)t.engine->save_checkpoint(ck.path(), "mine");
  EXPECT_NE(read_file(states), before);
  EXPECT_FALSE(fs::exists(ck.path() + "/.mine.partial"));
}

TEST(CheckpointReplace, LatestMovingBackIsLogged) {
  TempDir ck;
  ASSERT_TRUE(ck.ok());
  std::vector<std::string> lines;
  Trainer t(&lines);
  t.step();
  t.step();
  (void)t.engine->save_checkpoint(ck.path());  // global_step2
  std::vector<std::string> other_lines;
  Trainer fresh(&other_lines);
  fresh.step();
  (void)fresh.engine->save_checkpoint(ck.path());  // global_step1: latest moves back
  EXPECT_TRUE(any_contains(other_lines, "latest moves back from global_step2 to global_step1"))
      << ::testing::PrintToString(other_lines);
  std::string latest;
  std::ifstream(ck.path() + "/latest") >> latest;
  EXPECT_EQ(latest, "global_step1");
  EXPECT_TRUE(fs::exists(ck.path() + "/global_step2/" + model_states_file(2, 0)));
}

TEST(CheckpointReplace, CheckpointFileNames) {
  for (const char* name :
       {"mp_rank_00_model_states.pt", "zero_pp_rank_3_mp_rank_00_model_states.pt",
        "zero_pp_rank_12_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "pytorch_model.bin"}) {
    EXPECT_TRUE(is_checkpoint_file(name)) << name;
  }
  for (const char* name : {"notes.txt", "pytorch_model.bin.bak", "zero_to_fp32.py",
                           "mp_rank_00_model_states.pt.tmp", "latest"}) {
    EXPECT_FALSE(is_checkpoint_file(name)) << name;
  }
}

}  // namespace
}  // namespace zinf::engine
