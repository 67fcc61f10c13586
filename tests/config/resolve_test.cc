// resolve_auto: "auto" values from the model and the command line, the batch-size triangle,
// the printed lines, the swap-folder checks and the swap-buffer check against the model.
#include "engine/config/resolve.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/temp_dir.h"
#include "tests/config/test_util.h"

namespace zinf::config {
namespace {

using testing::error_of;
using testing::expect_error;

RunConfig parse(std::string_view json) { return parse_config_string(json, "test.json"); }

AutoContext on(int world) {
  AutoContext ctx;
  ctx.world_size = world;
  ctx.check_paths = false;
  return ctx;
}

struct Batch {
  int64_t train, micro, accumulation;
};
Batch resolved_batch(std::string_view json, const AutoContext& ctx) {
  RunConfig c = parse(json);
  resolve_auto(c, ctx);
  EXPECT_EQ(c.zero.gradient_accumulation_steps, *c.batch.gradient_accumulation_steps);
  return {*c.batch.train_batch_size, *c.batch.micro_batch_per_gpu,
          *c.batch.gradient_accumulation_steps};
}

void expect_batch(const Batch& b, int64_t train, int64_t micro, int64_t accumulation) {
  EXPECT_EQ(b.train, train);
  EXPECT_EQ(b.micro, micro);
  EXPECT_EQ(b.accumulation, accumulation);
}

// ---- the batch-size triangle
// ----------------------------------------------------------------------

TEST(ResolveTest, BatchTriangleFollowsDeepSpeed) {
  // Any two give the third.
  expect_batch(
      resolved_batch(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", on(2)), 32,
      4, 4);
  expect_batch(
      resolved_batch(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", on(4)), 32, 4,
      2);
  expect_batch(resolved_batch(R"({"train_micro_batch_size_per_gpu": 3,
                                  "gradient_accumulation_steps": 5})",
                              on(2)),
               30, 3, 5);
  // One alone: accumulation 1.
  expect_batch(resolved_batch(R"({"train_batch_size": 12})", on(3)), 12, 4, 1);
  expect_batch(resolved_batch(R"({"train_micro_batch_size_per_gpu": 2})", on(4)), 8, 2, 1);
  // All three, consistent.
  expect_batch(resolved_batch(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                                  "gradient_accumulation_steps": 4})",
                              on(2)),
               16, 2, 4);
}

TEST(ResolveTest, BatchSizesThatDisagreeShowTheThreeNumbers) {
  RunConfig c = parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                          "gradient_accumulation_steps": 4})");
  expect_error(error_of([&] { resolve_auto(c, on(3)); }), "train_batch_size",
               {"train_batch_size 16", "train_micro_batch_size_per_gpu 2",
                "gradient_accumulation_steps 4", "world size 3", "(= 24)"});
  // Derived values that do not divide evenly.
  c = parse(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  expect_error(error_of([&] { resolve_auto(c, on(1)); }), "train_batch_size",
               {"train_batch_size 10", "micro_batch_size_per_gpu 4"});
  c = parse(R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2})");
  expect_error(error_of([&] { resolve_auto(c, on(2)); }), "train_batch_size",
               {"gradient_accumulation_steps 0"});
  c = parse(R"({"gradient_accumulation_steps": 2})");
  expect_error(error_of([&] { resolve_auto(c, on(1)); }), "train_micro_batch_size_per_gpu",
               {"no batch size"});
}

TEST(ResolveTest, AutoBatchFromTheCommandLine) {
  AutoContext ctx = on(2);
  ctx.micro_batch_per_gpu = 3;
  RunConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                          "gradient_accumulation_steps": "auto"})");
  resolve_auto(c, ctx);
  EXPECT_EQ(c.batch.train_batch_size, 6);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 3);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_TRUE(c.auto_keys.empty());
  const std::vector<std::string> lines = resolved_lines(c);
  ASSERT_EQ(lines.size(), 4u);  // and zinf.accelerator.type
  EXPECT_EQ(lines[0], "train_micro_batch_size_per_gpu = 3 (auto: from the command line)");
  EXPECT_EQ(lines[1],
            "gradient_accumulation_steps = 1 (auto: 1 when only the micro batch is given)");
  EXPECT_EQ(lines[2], "train_batch_size = 6 (auto: micro x accumulation x world size = 3 x 1 x 2)");

  // Explicit values are never replaced by the command line's.
  c = parse(R"({"train_micro_batch_size_per_gpu": 4})");
  resolve_auto(c, ctx);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  // "auto" micro batch with nothing on the command line: derived from train_batch_size.
  c = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto"})");
  resolve_auto(c, on(2));
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  EXPECT_EQ(resolved_lines(c)[1],
            "train_micro_batch_size_per_gpu = 4 (auto: train_batch_size / (world size x "
            "accumulation) = 8 / (2 x 1))");
}

// ---- the model, the optimizer, precision, accelerator ------------------------------------------

TEST(ResolveTest, HiddenSizeRules) {
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto"}})");
  AutoContext ctx = on(1);
  ctx.hidden_size = 512;
  resolve_auto(c, ctx);
  EXPECT_EQ(c.zero.reduce_bucket_size, 262'144u);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 235'929u);  // floor(0.9 * 262144)
  EXPECT_EQ(c.zero.param_persistence_threshold, 5'120u);
  const std::vector<std::string> lines = resolved_lines(c);
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "zero_optimization.reduce_bucket_size = 262144 (auto: hidden^2 = 512^2)"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "zero_optimization.stage3_prefetch_bucket_size = 235929 (auto: 0.9 x "
                      "hidden^2 = 0.9 x 512^2)"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "zero_optimization.stage3_param_persistence_threshold = 5120 (auto: 10 x "
                      "hidden = 10 x 512)"),
            lines.end());

  // Without a hidden size: DeepSpeed's defaults, said so.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"reduce_bucket_size": "auto"}})");
  resolve_auto(c, on(1));
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000u);
  EXPECT_EQ(resolved_lines(c)[2],  // after the batch sizes
            "zero_optimization.reduce_bucket_size = 500000000 (auto: DeepSpeed's default; hidden "
            "size unknown)");
}

TEST(ResolveTest, OptimizerSchedulerAndClippingAutos) {
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                    "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
          "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}})");
  AutoContext ctx = on(1);
  ctx.lr = 2e-4;
  ctx.total_steps = 500;
  ctx.warmup_steps = 20;
  resolve_auto(c, ctx);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.zero.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr.value_or(-1.0), 2e-4);  // the optimizer's lr
  EXPECT_EQ(c.scheduler.warmup_num_steps, 20);
  EXPECT_EQ(c.scheduler.total_num_steps, 500);
  EXPECT_TRUE(c.auto_keys.empty());
  const std::vector<std::string> lines = resolved_lines(c);
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "optimizer.params.lr = 0.0002 (auto: from the command line)"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "scheduler.params.total_num_steps = 500 (auto: the run's number of steps)"),
            lines.end());

  // total_num_steps cannot be guessed.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupDecayLR",
                "params": {"total_num_steps": "auto"}}})");
  expect_error(error_of([&] { resolve_auto(c, on(1)); }), "scheduler.params.total_num_steps",
               {"\"auto\" needs the run's number of steps", "--steps"});
  // Once resolved, the cosine warning applies (DeepSpeed warns; the curve stays at its floor).
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": "auto", "warmup_num_steps": 50}}})");
  ctx.total_steps = 40;
  resolve_auto(c, ctx);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("scheduler.params.total_num_steps: 40 is not more than the "
                               "warm-up (50 steps"),
            std::string::npos)
      << c.warnings[0];
}

TEST(ResolveTest, PrecisionAutos) {
  AutoContext ctx = on(1);
  ctx.precision = zero::Precision::kBFloat16;
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "auto"},
                          "bf16": {"enabled": "auto"}})");
  resolve_auto(c, ctx);
  EXPECT_FALSE(c.precision.fp16_enabled);
  EXPECT_TRUE(c.precision.bf16_enabled);
  EXPECT_EQ(c.zero.precision, zero::Precision::kBFloat16);
  // An explicit fp16 plus an "auto" bf16 that resolves on: both enabled.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
                "bf16": {"enabled": "auto"}})");
  expect_error(error_of([&] { resolve_auto(c, ctx); }), "bf16.enabled", {"both true"});
  // Nothing asked: fp32.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "auto"}})");
  resolve_auto(c, on(1));
  EXPECT_EQ(c.zero.precision, zero::Precision::kFloat32);
}

// The HF Trainer's ZeRO-3 template (its documentation's ds_config_zero3.json, with the
// "amp" block of its apex section): every "auto" resolves, amp.enabled to false.
TEST(ResolveTest, HfTrainerZero3TemplateResolves) {
  RunConfig c = parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "amp": {"enabled": "auto", "opt_level": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
        "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": true},
        "offload_param": {"device": "cpu", "pin_memory": true},
        "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false})");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  AutoContext ctx = on(2);
  ctx.micro_batch_per_gpu = 4;
  ctx.total_steps = 100;
  ctx.hidden_size = 64;
  resolve_auto(c, ctx);
  EXPECT_TRUE(c.auto_keys.empty());
  EXPECT_EQ(c.zero.precision, zero::Precision::kFloat32);
  EXPECT_EQ(c.batch.train_batch_size, 8);
  const std::vector<std::string> lines = resolved_lines(c);
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "amp.enabled = false (auto: zinf has no apex AMP; fp16 / bf16 choose the "
                      "precision)"),
            lines.end());
}

// With the optimizer on NVMe the start-up lines say the two defaults that cost disk and host
// memory; a key the config gives is not repeated, and other tiers have neither line.
TEST(ResolveTest, OffloadDefaultsAreSaidWithTheOptimizerOnNvme) {
  auto lines_of = [](const std::string& zinf_keys, const char* device) {
    RunConfig c = parse(fmt::format(
        R"({{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": 3,
        "offload_optimizer": {{"device": "{}", "nvme_path": "/x"}}}}{}}})",
        device, zinf_keys));
    resolve_auto(c, on(1));
    return resolved_lines(c);
  };
  auto has = [](const std::vector<std::string>& lines, const std::string& start) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.rfind(start, 0) == 0; });
  };
  const std::vector<std::string> nvme = lines_of("", "nvme");
  EXPECT_TRUE(has(nvme, "zinf.overlap_optimizer = true (the default with the optimizer on NVMe"));
  EXPECT_TRUE(has(nvme, "zinf.grad_offload = cpu (the default with the optimizer on NVMe"));
  const std::vector<std::string> given =
      lines_of(R"(, "zinf": {"overlap_optimizer": false, "grad_offload": "nvme"})", "nvme");
  EXPECT_FALSE(has(given, "zinf.overlap_optimizer"));
  EXPECT_FALSE(has(given, "zinf.grad_offload"));
  const std::vector<std::string> cpu = lines_of("", "cpu");
  EXPECT_FALSE(has(cpu, "zinf.overlap_optimizer"));
  EXPECT_FALSE(has(cpu, "zinf.grad_offload"));
}

TEST(ResolveTest, AcceleratorAuto) {
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  resolve_auto(c, on(1));
  EXPECT_EQ(c.zinf.accelerator, AcceleratorType::kCpu);
  EXPECT_EQ(resolved_lines(c).back(), "zinf.accelerator.type = cpu (auto: no usable CUDA device)");
  c = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  AutoContext ctx = on(1);
  ctx.cuda_available = true;
  resolve_auto(c, ctx);
  EXPECT_EQ(c.zinf.accelerator, AcceleratorType::kCuda);
  // An explicit choice stays.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "zinf": {"accelerator": {"type": "cpu"}}})");
  resolve_auto(c, ctx);
  EXPECT_EQ(c.zinf.accelerator, AcceleratorType::kCpu);
}

TEST(ResolveTest, ExamplesResolve) {
  for (const char* name : {"zero2.json", "zero3_cpu_offload.json", "zero3_nvme.json"}) {
    SCOPED_TRACE(name);
    RunConfig c = parse_config(std::string(ZINF_SHARED_DIR) + "/examples/" + name);
    AutoContext ctx;
    ctx.world_size = 2;
    ctx.hidden_size = 256;
    ASSERT_NO_THROW(resolve_auto(c, ctx));  // the nvme example's /dev/shm is checked
    EXPECT_EQ(*c.batch.train_batch_size,
              *c.batch.micro_batch_per_gpu * *c.batch.gradient_accumulation_steps * 2);
  }
}

// ---- swap folders
// ---------------------------------------------------------------------------------

std::string nvme_config(const std::string& param_path, const std::string& optimizer_path) {
  return R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
         param_path + R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
         optimizer_path + R"("}}})";
}

TEST(ResolveTest, NvmePathsMustExistAndBeWritable) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string missing = dir.file("nope");
  RunConfig c = parse(nvme_config(dir.path(), missing));
  AutoContext ctx;
  expect_error(error_of([&] { resolve_auto(c, ctx); }),
               "zero_optimization.offload_optimizer.nvme_path", {missing, "does not exist"});

  const std::string file = dir.file("a_file");
  std::ofstream(file) << "x";
  c = parse(nvme_config(file, dir.path()));
  expect_error(error_of([&] { resolve_auto(c, ctx); }), "zero_optimization.offload_param.nvme_path",
               {file, "is not a directory"});

  // /proc takes no new files, even as root: named as a virtual file system, not as a
  // permission problem (whose errno text, ENOENT, misled).
  c = parse(nvme_config("/proc", "/proc"));
  expect_error(error_of([&] { check_nvme_paths(c); }), "zero_optimization.offload_param.nvme_path",
               {"/proc", "is on procfs, a virtual file system"});

  // zinf.nvme_paths listing one folder twice (under two spellings) is a config error.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme"}}, "zinf": {"nvme_paths": [")" +
            dir.path() + R"(", ")" + dir.path() + R"(/."]}})");
  expect_error(error_of([&] { check_nvme_paths(c); }), "zinf.nvme_paths[1]",
               {"give each folder once"});

  // zinf.nvme_paths entries are named by index.
  c = parse(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme"}}, "zinf": {"nvme_paths": [")" +
            dir.path() + R"(", ")" + missing + R"("]}})");
  expect_error(error_of([&] { check_nvme_paths(c); }), "zinf.nvme_paths[1]", {"does not exist"});

  // A good folder passes and is left as it was.
  c = parse(nvme_config(dir.path(), dir.path()));
  EXPECT_NO_THROW(resolve_auto(c, ctx));
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);  // a_file only: the probe is gone
}

// ---- swap buffers against the model -----------------------------------------------------------

TEST(ResolveTest, ParamBuffersMustHoldTheLargestPartition) {
  const std::string json = R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
      "stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x", "buffer_count": 2,
      "buffer_size": 1000, "max_in_cpu": 0}}})";
  RunConfig c = parse(json);
  AutoContext ctx = on(1);
  ctx.param_numels = {100, 5000, 300};
  expect_error(error_of([&] { resolve_auto(c, ctx); }),
               "zero_optimization.offload_param.buffer_count",
               {"2 buffers of 1000 elements", "5000 elements", "into 5 buffers",
                "buffer_count to at least 5", "buffer_size to at least 2500"});
  // Over 4 ranks each holds 1250 elements of it: two buffers.
  c = parse(json);
  ctx.world_size = 4;
  EXPECT_NO_THROW(resolve_auto(c, ctx));
  // A partition that max_in_cpu keeps in memory needs no buffer.
  EXPECT_NO_THROW(validate_with_model(
      parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
               "nvme_path": "/x", "buffer_count": 1, "buffer_size": 1000, "max_in_cpu": 6000}}})"),
      {5000, 800}, 1));
  // Other tiers have no such pool.
  EXPECT_NO_THROW(validate_with_model(
      parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})"),
      {1'000'000'000'000}, 1));
}

TEST(ResolveTest, WorldSizeMustBePositive) {
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1})");
  expect_error(error_of([&] { resolve_auto(c, on(0)); }), "", {"world size must be at least 1"});
}

}  // namespace
}  // namespace zinf::config
