// DeepSpeed's csv_monitor as `zinf train` wires it (engine events -> CsvMonitor): the files
// are <output_path>/<job_name>/<event with '/' and ' ' as '_'>.csv, each opening with
// `step,<last part of the event name>`, then one `step,value` row per optimizer step, the
// step being the global sample count; wall_clock_breakdown adds DeepSpeed's timing events.

#include "engine/csv_monitor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/temp_dir.h"

namespace zinf::engine {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(CsvMonitor, EngineEventsGoToDeepSpeedsFilesAndColumns) {
  ::zinf::testing::TempDir dir;
  const std::string out = dir.path() + "/out";
  CsvMonitor csv(out, "job");
  EXPECT_EQ(csv.folder(), out + "/job");

  EngineOptions o;
  o.zero.stage = 2;
  o.zero.gradient_accumulation_steps = 2;
  o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
  o.optimizer.lr = 1e-3;
  o.micro_batch_size = 3;
  o.steps_per_print = 0;
  o.wall_clock_breakdown = true;
  o.memory_budget = 1ull << 30;
  o.monitor = [&](const MonitorEvent& e) { csv.write(e.name, e.samples, e.value); };
  LlamaConfig c = *named_llama("tiny", 64);
  c.hidden_size = 32;
  c.intermediate_size = 88;
  c.num_layers = 1;
  auto model = std::make_shared<LlamaModelImpl>(c);
  Engine engine(model, o,
                [](const std::string& name, at::Tensor& full) { init_parameter(5, name, full); });
  at::manual_seed(5);
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    losses.push_back(engine
                         .train_batch([&](int) {
                           const at::Tensor seq = at::randint(c.vocab_size, {3, 9}, at::kLong);
                           return model->loss(seq.narrow(1, 0, 8), seq.narrow(1, 1, 8));
                         })
                         .loss);
  }

  const std::vector<std::string> loss = lines_of(out + "/job/Train_Samples_train_loss.csv");
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_EQ(loss[0], "step,train_loss");
  // Step = global samples: 3 per micro-batch x 2 micro-batches per step.
  EXPECT_EQ(loss[1].substr(0, 2), "6,");
  EXPECT_EQ(loss[2].substr(0, 3), "12,");
  EXPECT_NEAR(std::stod(loss[2].substr(3)), losses[1], 1e-9 * std::abs(losses[1]));
  const std::vector<std::string> lr = lines_of(out + "/job/Train_Samples_lr.csv");
  ASSERT_EQ(lr.size(), 3u);
  EXPECT_EQ(lr[0], "step,lr");
  EXPECT_EQ(lr[1], "6,0.001");
  for (const char* event :
       {"forward", "backward", "backward_inner", "backward_allreduce", "step"}) {
    const std::string name = std::string("elapsed_time_ms_") + event;
    const std::vector<std::string> rows = lines_of(out + "/job/Train_Samples_" + name + ".csv");
    ASSERT_EQ(rows.size(), 3u) << name;
    EXPECT_EQ(rows[0], "step," + name);
  }
  // fp32: no loss scale events.
  EXPECT_FALSE(std::filesystem::exists(out + "/job/Train_Samples_loss_scale.csv"));
}

TEST(CsvMonitor, SpacesBecomeUnderscoresAndAResumedFileKeepsOneHeader) {
  ::zinf::testing::TempDir dir;
  {
    CsvMonitor csv(dir.path(), "DeepSpeedJobName");
    EXPECT_EQ(csv.file_for("Train/Samples/my loss"),
              dir.path() + "/DeepSpeedJobName/Train_Samples_my_loss.csv");
    csv.write("Train/Samples/my loss", 4, 1.5);
  }
  CsvMonitor again(dir.path(), "DeepSpeedJobName");
  again.write("Train/Samples/my loss", 8, 0.25);
  EXPECT_EQ(lines_of(dir.path() + "/DeepSpeedJobName/Train_Samples_my_loss.csv"),
            (std::vector<std::string>{"step,my loss", "4,1.5", "8,0.25"}));
}

}  // namespace
}  // namespace zinf::engine
