// Power loss during a checkpoint save (engine/checkpoint.h's crash-safety protocol). A save's
// writes go through serialization's FileSystem seam; here it is the fake of
// tests/common/fault_injection_file_system.h. The power fails at a seeded random call of a
// save of B into a folder holding A, and the fake takes back everything not synced then (file
// bytes past the last fsync, directory entries changed since their directory's last fsync).
// Afterwards `latest` names A or B and loads exactly that state (its step count, and the next
// two losses of a reference run from it), A still loads, B, where `latest` does not name it,
// loads exactly or fails with an error, and the next save succeeds. Stage 3 with the states on
// NVMe (saves streamed and prepared before their step), stage 2 in memory; B under a new tag
// and under A's (the atomic exchange, and the renames of a filesystem that cannot exchange).
// A save that returned survives a power loss, also into a folder made just before it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/fault_injection_file_system.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/engine/tiny_llama.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;
using zinf::testing::FaultInjectionFileSystem;
using zinf::testing::ScopedDefaultFileSystem;
using zinf::testing::TempDir;

constexpr int64_t kSeq = 16;
constexpr int64_t kStepsA = 2;  // A is the state after 2 steps, B after 3

EngineOptions options(int stage, const std::string& nvme = {}) {
  EngineOptions o;
  o.zero.stage = stage;
  o.optimizer.type = optimizer_cpu::OptimizerKind::kAdamW;
  o.optimizer.lr = 3e-3;
  o.optimizer.weight_decay = 0.01;
  o.micro_batch_size = 2;
  o.tokens_per_sample = kSeq;
  o.steps_per_print = 0;
  o.memory_budget = 1ull << 30;
  o.log = [](const std::string&) {};
  if (!nvme.empty()) {
    o.zero.offload_optimizer = zero::OffloadTarget::kNvme;
    o.zero.offload_param = zero::OffloadTarget::kNvme;
    o.zero.nvme_paths = {nvme};
    o.zero.sub_group_size = 5000;  // several sub-groups: the states are streamed in pieces
    o.zero.param_buffer_size = 4000;
    o.zero.param_max_in_cpu = 0;
    o.zero.prefetch_bucket_size = 10000;
    o.zero.aio.backend = aio::BackendKind::kPsync;
  }
  return o;
}

// An engine over a model initialised from `seed`, and the next micro-batch it trains on.
struct Trainer {
  Trainer(const EngineOptions& o, uint64_t seed)
      : model(std::make_shared<LlamaModelImpl>(testing::tiny_llama(16))) {
    engine = std::make_unique<Engine>(model, o, [seed](const std::string& name, at::Tensor& full) {
      init_parameter(seed, name, full);
    });
  }
  std::vector<double> train(int steps) {
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      losses.push_back(engine
                           ->train_batch([&](int) {
                             auto [x, y] = testing::arithmetic_batch(1000 + index++, 2, kSeq);
                             return model->loss(x, y);
                           })
                           .loss);
    }
    return losses;
  }
  CheckpointReport save(const std::string& dir, const std::string& tag) {
    return engine->save_checkpoint(dir, tag, {{"data_position", index}});
  }
  void load(const std::string& dir, const std::string& tag = {}) {
    const CheckpointReport r = engine->load_checkpoint(dir, tag);
    index = std::get<int64_t>(r.client_state.at("data_position"));
  }

  std::shared_ptr<LlamaModelImpl> model;
  std::unique_ptr<Engine> engine;
  int64_t index = 0;
};

std::string read_latest(const std::string& dir) {
  std::string tag;
  std::ifstream(dir + "/latest") >> tag;
  return tag;
}

// Expects `check`, just loaded, to hold exactly the state of the reference run after the step
// count it holds, A's or B's: the next two losses equal the reference's (the first depends on
// the parameters, the second on the optimizer's moments too). Returns that step count.
int64_t expect_loaded_state(Trainer& check, const std::vector<double>& reference) {
  const int64_t step = check.engine->global_steps();
  if (step != kStepsA && step != kStepsA + 1) {
    ADD_FAILURE() << "loaded a checkpoint of step " << step;
    return step;
  }
  const std::vector<double> losses = check.train(2);
  for (int i = 0; i < 2; ++i) {
    const double want = reference[static_cast<size_t>(step + i)];
    EXPECT_NEAR(losses[static_cast<size_t>(i)], want, 1e-6 * std::abs(want))
        << "step " << step + 1 + i << " after loading the checkpoint of step " << step;
  }
  return step;
}

// Loads `tag` (empty: the one `latest` names) of `dir` into `check` and checks the state it
// holds (expect_loaded_state). Returns its step count, or -1 when the load failed (a failure).
int64_t expect_exact_state(Trainer& check, const std::string& dir, const std::string& tag,
                           const std::vector<double>& reference) {
  try {
    check.load(dir, tag);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "loading " << (tag.empty() ? "latest" : tag) << " failed: " << e.what();
    return -1;
  }
  return expect_loaded_state(check, reference);
}

struct Scenario {
  int stage = 3;
  bool nvme = true;
  bool prepared = false;     // the step before the save writes its optimizer file
  bool same_tag = false;     // B replaces A's tag folder instead of taking a new one
  bool no_exchange = false;  // the filesystem refuses RENAME_EXCHANGE: the rename fallback
  int trials = 10;
};

void expect_power_losses_keep_a_checkpoint(const Scenario& s) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  TempDir swap_run, swap_check, base_dir;
  const EngineOptions run_options = options(s.stage, s.nvme ? swap_run.path() : "");
  const EngineOptions check_options = options(s.stage, s.nvme ? swap_check.path() : "");
  // Losses of steps 1..kStepsA + 3 of an uninterrupted run; the engines share no swap folder
  // while alive (the reference's is gone before `run` takes it).
  const std::vector<double> reference = Trainer(run_options, 7).train(kStepsA + 3);
  ASSERT_GT(std::abs(reference[kStepsA] - reference[kStepsA + 1]), 1e-4)
      << "A's and B's next losses must tell them apart";

  const std::string base = base_dir.file("ck");
  Trainer run(run_options, 7);
  run.train(kStepsA);
  run.save(base, "A");  // through the system calls: durable for every trial
  const std::string tag_b = s.same_tag ? "A" : "B";
  if (!s.prepared) run.train(1);  // holds B from now on
  Trainer check(check_options, 5);

  // Saves B through `files` into `dir` (a copy of base); returns the error, "" for none.
  // Prepared, `run` goes back to A, prepares the save and steps to B, the step writing B's
  // optimizer file as it updates the sub-groups.
  uint64_t step_written = 0;
  auto save_b = [&](const std::string& dir, FaultInjectionFileSystem& files) -> std::string {
    if (s.prepared) run.load(dir, "A");  // reads only
    ScopedDefaultFileSystem installed(&files);
    std::string error;
    try {
      if (s.prepared && !run.engine->prepare_checkpoint(dir, tag_b)) error = "not prepared";
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (s.prepared) run.train(1);  // holds B from here on, whether prepared or not
    if (!error.empty()) return error;
    try {
      step_written = run.save(dir, tag_b).step_written_bytes;
      return {};
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  auto copy_base = [&](const TempDir& into) {
    const std::string dir = into.file("ck");
    fs::copy(base, dir, fs::copy_options::recursive);
    return dir;
  };

  // The calls of a whole save; after it returned, B survives a power loss.
  int64_t calls = 0;
  {
    TempDir trial;
    const std::string dir = copy_base(trial);
    FaultInjectionFileSystem files(trial.file("graveyard"));
    files.refuse_exchange(s.no_exchange);
    ASSERT_EQ(save_b(dir, files), "");
    EXPECT_EQ(step_written > 0, s.prepared) << "the step wrote " << step_written << " bytes";
    calls = files.calls();
    files.drop_unsynced();
    EXPECT_EQ(read_latest(dir), tag_b);
    EXPECT_EQ(expect_exact_state(check, dir, "", reference), kStepsA + 1);
  }
  ASSERT_GT(calls, 20);

  for (int trial_index = 0; trial_index < s.trials; ++trial_index) {
    // Half the trials anywhere in the save (mostly writes of records), half among its last
    // calls: the syncs, renames and `latest`, where the protocol matters most.
    const int64_t first = trial_index % 2 == 0 ? 1 : std::max<int64_t>(1, calls - 15);
    const int64_t kill_at = std::uniform_int_distribution<int64_t>(first, calls)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial_index) + ": the power fails at call " +
                 std::to_string(kill_at) + " of " + std::to_string(calls));
    TempDir trial;
    const std::string dir = copy_base(trial);
    FaultInjectionFileSystem files(trial.file("graveyard"));
    files.refuse_exchange(s.no_exchange);
    files.kill_at(kill_at);
    const std::string error = save_b(dir, files);
    EXPECT_TRUE(files.dead());
    EXPECT_NE(error, "") << "the save returned although the power failed in it";
    files.drop_unsynced();

    // `latest` names A or B and loads exactly that state.
    const std::string latest = read_latest(dir);
    const int64_t step = expect_exact_state(check, dir, "", reference);
    if (s.same_tag) {
      EXPECT_EQ(latest, "A");
    } else {
      ASSERT_TRUE(latest == "A" || latest == "B") << "latest: \"" << latest << "\"";
      EXPECT_EQ(step, latest == "A" ? kStepsA : kStepsA + 1) << "latest: " << latest;
      if (latest == "B") {
        EXPECT_EQ(expect_exact_state(check, dir, "A", reference), kStepsA) << "A still loads";
      } else if (fs::exists(dir + "/B")) {
        // Not named by latest: B loads exactly, or fails with an error naming where (never
        // silently wrong data).
        bool loaded = false;
        try {
          check.load(dir, "B");
          loaded = true;
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
        }
        if (loaded) {
          EXPECT_EQ(expect_loaded_state(check, reference), kStepsA + 1);
        }
      }
    }
    // The next save, power on, cleans up what the cut one left and succeeds.
    run.save(dir, tag_b);
    EXPECT_EQ(read_latest(dir), tag_b);
    EXPECT_FALSE(fs::exists(dir + "/." + tag_b + ".partial"));
  }
}

TEST(CheckpointPowerLoss, Stage3OnNvmeToANewTag) {
  expect_power_losses_keep_a_checkpoint({.stage = 3, .nvme = true, .trials = 16});
}

TEST(CheckpointPowerLoss, Stage3OnNvmePreparedBeforeTheStep) {
  expect_power_losses_keep_a_checkpoint({.stage = 3, .nvme = true, .prepared = true, .trials = 8});
}

TEST(CheckpointPowerLoss, Stage3OnNvmeOverTheSameTag) {
  expect_power_losses_keep_a_checkpoint({.stage = 3, .nvme = true, .same_tag = true, .trials = 8});
}

TEST(CheckpointPowerLoss, Stage2ToANewTag) {
  expect_power_losses_keep_a_checkpoint({.stage = 2, .nvme = false, .trials = 16});
}

TEST(CheckpointPowerLoss, Stage2OverTheSameTagWithoutExchange) {
  expect_power_losses_keep_a_checkpoint(
      {.stage = 2, .nvme = false, .same_tag = true, .no_exchange = true, .trials = 8});
}

// A folder made by the save, or just before it without its parent synced (zinf train makes
// the --save folder at start-up): once the save returned, a power loss keeps the folder and
// the checkpoint in it.
TEST(CheckpointPowerLoss, ASavedCheckpointSurvivesInAFolderMadeJustBefore) {
  TempDir root;
  const EngineOptions o = options(2);
  const std::vector<double> reference = Trainer(o, 7).train(kStepsA + 2);
  Trainer run(o, 7);
  run.train(kStepsA);
  Trainer check(o, 5);
  FaultInjectionFileSystem files(root.file("graveyard"));
  for (const bool made_before : {false, true}) {
    SCOPED_TRACE(made_before ? "a folder made just before" : "a folder the save makes");
    const std::string dir = root.file(made_before ? "before/ck" : "new/deeper/ck");
    {
      ScopedDefaultFileSystem installed(&files);
      if (made_before) {
        fs::create_directories(root.file("before"));  // durable
        ASSERT_EQ(files.mkdir(dir, 0777), 0);         // not: its parent is not synced
      }
      run.save(dir, "A");
    }
    files.drop_unsynced();
    ASSERT_EQ(read_latest(dir), "A") << dir << " or its latest was lost";
    EXPECT_EQ(expect_exact_state(check, dir, "", reference), kStepsA);
  }
}

}  // namespace
}  // namespace zinf::engine
