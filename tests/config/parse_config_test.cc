// parse_config: the shared example configs, DeepSpeed's defaults and number forms, and the
// message of every invalid value and combination (path and reason).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/config/json_reader.h"
#include "engine/config/run_config.h"
#include "tests/common/temp_dir.h"
#include "tests/config/test_util.h"

namespace zinf::config {
namespace {

using testing::expect_error;
using testing::has_warning;
using testing::parse_error;
using zero::OffloadTarget;
using zero::Precision;

const std::string kExamples = std::string(ZINF_SHARED_DIR) + "/examples";

RunConfig parse(std::string_view json) { return parse_config_string(json, "test.json"); }

// ---- the shared examples ------------------------------------------------------------------------

TEST(ParseConfigTest, EveryExampleParsesWithoutWarnings) {
  ASSERT_TRUE(std::filesystem::is_directory(kExamples))
      << kExamples << " is missing: the tests read ../shared beside the checkout";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kExamples)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    ++files;
    RunConfig c;
    ASSERT_NO_THROW(c = parse_config(entry.path().string()));
    EXPECT_EQ(c.source, entry.path().string());
    EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
    EXPECT_TRUE(c.optimizer.given);
  }
  EXPECT_GE(files, 3);
}

TEST(ParseConfigTest, Zero2Example) {
  RunConfig c = parse_config(kExamples + "/zero2.json");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 2);
  EXPECT_FALSE(c.batch.train_batch_size);
  EXPECT_EQ(c.zero.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr.value_or(-1.0), 3e-4);
  EXPECT_EQ(c.zero.precision, Precision::kBFloat16);
  EXPECT_DOUBLE_EQ(c.zero.gradient_clipping, 1.0);
  EXPECT_EQ(c.zero_extra.allgather_bucket_size, 300'000'000u);
  EXPECT_EQ(c.zero.reduce_bucket_size, 300'000'000u);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.steps_per_print, 10);
}

TEST(ParseConfigTest, Zero3CpuOffloadExample) {
  RunConfig c = parse_config(kExamples + "/zero3_cpu_offload.json");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param, OffloadTarget::kCpu);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadTarget::kCpu);
  EXPECT_TRUE(c.zero_extra.param_pin_memory);
  EXPECT_TRUE(c.zero_extra.optimizer_pin_memory);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c.zero.reduce_bucket_size, 1'000'000u);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 940'000u);  // 0.94e6
  EXPECT_EQ(c.zero.param_persistence_threshold, 10'000u);
  EXPECT_EQ(c.zero.max_live_parameters, 1'000'000'000u);
  EXPECT_EQ(c.zero.max_reuse_distance, 1'000'000'000u);
  EXPECT_TRUE(c.checkpoint.gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.precision, Precision::kFloat16);
  EXPECT_EQ(c.zero.loss_scale.loss_scale, 0.0);
  EXPECT_EQ(c.zero.loss_scale.loss_scale_window, 1000);
  EXPECT_EQ(c.zero.loss_scale.initial_scale_power, 16);
  EXPECT_EQ(c.zero.loss_scale.hysteresis, 2);
  EXPECT_EQ(c.zero.loss_scale.min_loss_scale, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 3e-7);
  EXPECT_EQ(c.steps_per_print, 2000);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.zero.nvme_paths.empty());
}

TEST(ParseConfigTest, Zero3NvmeExample) {
  RunConfig c = parse_config(kExamples + "/zero3_nvme.json");
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 2);
  EXPECT_FALSE(c.batch.gradient_accumulation_steps);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);  // DeepSpeed's "Adam" is AdamW unless told otherwise
  EXPECT_EQ(c.zero.offload_param, OffloadTarget::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadTarget::kNvme);
  EXPECT_EQ(c.zero.nvme_paths, std::vector<std::string>{"/dev/shm"});
  EXPECT_EQ(c.zero.optimizer_buffer_count, 4u);
  EXPECT_EQ(c.zero.param_buffer_count, 5u);
  EXPECT_EQ(c.zero.param_buffer_size, 100'000'000u);
  EXPECT_EQ(c.zero.param_max_in_cpu, 1'000'000'000u);
  EXPECT_FALSE(c.zero_extra.fast_init);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 4'000'000u);
  EXPECT_EQ(c.zero.aio.block_size, 1048576u);
  EXPECT_EQ(c.zero.aio.queue_depth, 8);
  EXPECT_EQ(c.zero.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.zero.aio.single_submit);
  EXPECT_TRUE(c.zero.aio.overlap_events);
}

TEST(ParseConfigTest, EveryDocumentedKeyIsReadWithoutWarnings) {
  RunConfig c = parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5, "steps_per_print": 7, "wall_clock_breakdown": true,
    "dump_state": false, "prescale_gradients": false, "communication_data_type": "fp32",
    "optimizer": {"type": "Adam", "params": {"lr": 2e-4, "betas": [0.8, 0.99], "eps": 1e-6,
        "weight_decay": 0.1, "bias_correction": false, "adam_w_mode": false,
        "torch_adam": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 2e-4,
        "warmup_num_steps": 30, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "auto_cast": true, "loss_scale": 128, "initial_scale_power": 12,
        "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": true,
        "min_loss_scale": 0.5},
    "bf16": {"enabled": false},
    "zero_optimization": {"stage": 3, "contiguous_gradients": false, "reduce_scatter": false,
        "reduce_bucket_size": 2e6, "allgather_partitions": false, "allgather_bucket_size": 3e6,
        "overlap_comm": false, "sub_group_size": 4e6, "stage3_prefetch_bucket_size": 5e6,
        "stage3_param_persistence_threshold": 6e3, "stage3_model_persistence_threshold": 7e6,
        "stage3_max_live_parameters": 8e6, "stage3_max_reuse_distance": 9e6,
        "stage3_gather_16bit_weights_on_model_save": true,
        "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_count": 6,
            "buffer_size": 2e7, "max_in_cpu": 3e7, "pin_memory": true},
        "offload_optimizer": {"device": "nvme", "nvme_path": "/o", "buffer_count": 8,
            "pin_memory": true, "pipeline_read": true, "pipeline_write": true,
            "fast_init": true, "ratio": 0.5}},
    "aio": {"block_size": 2097152, "queue_depth": 16, "intra_op_parallelism": 4,
        "single_submit": true, "overlap_events": false, "use_gds": false},
    "csv_monitor": {"enabled": true, "output_path": "out", "job_name": "j"},
    "checkpoint": {"tag_validation": "Ignore", "load_universal": false,
        "use_node_local_storage": true}})");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_DOUBLE_EQ(c.zero.gradient_clipping, 0.5);
  EXPECT_EQ(c.steps_per_print, 7);
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 1e-5);
  EXPECT_TRUE(c.precision.fp16_auto_cast);
  EXPECT_EQ(c.zero.loss_scale.loss_scale, 128.0);
  EXPECT_EQ(c.zero.loss_scale.initial_scale_power, 12);
  EXPECT_EQ(c.zero.loss_scale.loss_scale_window, 500);
  EXPECT_EQ(c.zero.loss_scale.hysteresis, 3);
  EXPECT_TRUE(c.zero.loss_scale.consecutive_hysteresis);
  EXPECT_EQ(c.zero.loss_scale.min_loss_scale, 0.5);
  EXPECT_FALSE(c.zero.contiguous_gradients);
  EXPECT_FALSE(c.zero.reduce_scatter);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_FALSE(c.zero_extra.allgather_partitions);
  EXPECT_EQ(c.zero.sub_group_size, 4'000'000u);
  EXPECT_EQ(c.zero.model_persistence_threshold, 7'000'000u);
  EXPECT_EQ(c.zero.max_live_parameters, 8'000'000u);
  EXPECT_EQ(c.zero.max_reuse_distance, 9'000'000u);
  EXPECT_EQ(c.zero.param_buffer_count, 6u);
  EXPECT_EQ(c.zero.param_buffer_size, 20'000'000u);
  EXPECT_EQ(c.zero.param_max_in_cpu, 30'000'000u);
  EXPECT_EQ(c.zero.optimizer_buffer_count, 8u);
  EXPECT_TRUE(c.zero.pipeline_read);
  EXPECT_TRUE(c.zero.pipeline_write);
  EXPECT_TRUE(c.zero_extra.fast_init);
  EXPECT_DOUBLE_EQ(c.zero_extra.offload_ratio, 0.5);
  EXPECT_EQ(c.zero.nvme_paths, (std::vector<std::string>{"/p", "/o"}));
  EXPECT_EQ(c.zero.aio.intra_op_parallelism, 4);
  EXPECT_EQ(c.zero.communication_data_type, "fp32");
  EXPECT_EQ(c.checkpoint.tag_validation, "Ignore");
  EXPECT_TRUE(c.checkpoint.use_node_local_storage);
}

// ---- defaults and number forms ------------------------------------------------------------------

TEST(ParseConfigTest, EmptyConfigHasDeepSpeedDefaults) {
  RunConfig c = parse("{}");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm);  // DeepSpeed: true at stage 3 only
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000u);
  EXPECT_EQ(c.zero_extra.allgather_bucket_size, 500'000'000u);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000u);
  EXPECT_EQ(c.zero.model_persistence_threshold, UINT64_MAX);
  EXPECT_EQ(c.zero.max_live_parameters, 1'000'000'000u);
  EXPECT_EQ(c.zero.max_reuse_distance, 1'000'000'000u);
  EXPECT_EQ(c.zero.offload_param, OffloadTarget::kNone);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadTarget::kNone);
  EXPECT_EQ(c.zero.param_buffer_count, 5u);
  EXPECT_EQ(c.zero.param_buffer_size, 100'000'000u);
  EXPECT_EQ(c.zero.param_max_in_cpu, 1'000'000'000u);
  EXPECT_EQ(c.zero.optimizer_buffer_count, 4u);
  EXPECT_EQ(c.zero.precision, Precision::kFloat32);
  EXPECT_EQ(c.zero.gradient_clipping, 1.0);  // DeepSpeed 0.19.8's default
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.optimizer.given);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  EXPECT_FALSE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_EQ(c.zinf.accelerator, AcceleratorType::kAuto);
  EXPECT_FALSE(c.zinf.memory_budget_bytes);
  EXPECT_TRUE(c.zero.swap_checksums);
  EXPECT_EQ(c.zero.comm_timeout.count(), 300'000);
  EXPECT_EQ(parse(R"({"zero_optimization": {"stage": 3}})").zero.overlap_comm, true);
}

TEST(ParseConfigTest, CountsInExponentForm) {
  RunConfig c = parse(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,
      "stage3_prefetch_bucket_size": 0.94e6, "sub_group_size": 1E9,
      "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e9,
      "stage3_model_persistence_threshold": 1.5e3}})");
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000u);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 940'000u);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c.zero.param_persistence_threshold, 10'000u);
  EXPECT_EQ(c.zero.max_live_parameters, 3'000'000'000u);
  EXPECT_EQ(c.zero.model_persistence_threshold, 1'500u);
  // Whole numbers in exponent form are fine for plain integers too.
  EXPECT_EQ(parse(R"({"train_micro_batch_size_per_gpu": 4e0})").batch.micro_batch_per_gpu, 4);
}

TEST(ParseConfigTest, PrefixlessAliasesOfStage3Keys) {
  RunConfig c = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 123,
      "param_persistence_threshold": 45, "max_live_parameters": 6e6}})");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.zero.prefetch_bucket_size, 123u);
  EXPECT_EQ(c.zero.param_persistence_threshold, 45u);
  EXPECT_EQ(c.zero.max_live_parameters, 6'000'000u);
  expect_error(parse_error(R"({"zero_optimization": {"stage3_max_live_parameters": 1,
                                                     "max_live_parameters": 2}})"),
               "zero_optimization.max_live_parameters", {"given twice", "keep one"});
}

TEST(ParseConfigTest, AutoValuesAreKeptForResolution) {
  RunConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                    "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
                    "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                    "total_num_steps": "auto"}},
      "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_TRUE(c.warnings.empty());
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "optimizer.params.lr", "optimizer.params.betas",
        "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled",
        "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold"}) {
    EXPECT_TRUE(c.is_auto(key)) << key;
  }
  EXPECT_EQ(c.auto_keys.size(), 17u);
  EXPECT_FALSE(c.batch.train_batch_size);
}

// ---- wrong types: the path, the expected type and the value seen
// ---------------------------------

TEST(ParseConfigTest, WrongTypesNameThePathTheTypeAndTheValue) {
  expect_error(parse_error(R"({"zero_optimization": {"stage": "eight"}})"),
               "zero_optimization.stage", {"expected a whole number in [0, 3]", "\"eight\""});
  expect_error(parse_error(R"({"zero_optimization": {"stage": 4}})"), "zero_optimization.stage",
               {"[0, 3]", "got 4"});
  expect_error(parse_error(R"({"zero_optimization": {"reduce_bucket_size": "eight"}})"),
               "zero_optimization.reduce_bucket_size", {"whole number >= 0", "\"eight\""});
  expect_error(parse_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5e0}})"),
               "zero_optimization.reduce_bucket_size", {"whole number", "1.5"});
  expect_error(parse_error(R"({"zero_optimization": {"sub_group_size": -1}})"),
               "zero_optimization.sub_group_size", {"whole number >= 0", "-1"});
  expect_error(parse_error(R"({"train_micro_batch_size_per_gpu": 0})"),
               "train_micro_batch_size_per_gpu", {"whole number >= 1", "got 0"});
  expect_error(parse_error(R"({"optimizer": {"type": "Adam", "params": {"lr": "fast"}}})"),
               "optimizer.params.lr", {"a number >= 0", "\"fast\""});
  expect_error(parse_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})"),
               "optimizer.params.betas", {"two numbers in [0, 1)", "[0.9]"});
  expect_error(parse_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}})"),
               "optimizer.params.betas", {"[0.9,1.5]"});
  expect_error(parse_error(R"({"fp16": {"enabled": "yes"}})"), "fp16.enabled",
               {"true or false", "\"yes\""});
  expect_error(parse_error(R"({"zero_optimization": {"offload_param": {"device": "disk"}}})"),
               "zero_optimization.offload_param.device",
               {"one of \"none\", \"cpu\", \"nvme\"", "\"disk\""});
  expect_error(parse_error(R"({"zero_optimization": 3})"), "zero_optimization",
               {"an object", "got 3"});
  expect_error(parse_error(R"({"csv_monitor": {"output_path": 7}})"), "csv_monitor.output_path",
               {"a string", "got 7"});
}

TEST(ParseConfigTest, AutoIsRefusedWhereDeepSpeedHasNoAutoRule) {
  expect_error(parse_error(R"({"zero_optimization": {"stage": "auto"}})"),
               "zero_optimization.stage", {"\"auto\" is not accepted for this key"});
  expect_error(parse_error(R"({"zero_optimization": {"sub_group_size": "auto"}})"),
               "zero_optimization.sub_group_size", {"\"auto\" is not accepted"});
}

// ---- invalid combinations -----------------------------------------------------------------------

TEST(ParseConfigTest, NvmeWithoutNvmePath) {
  expect_error(parse_error(R"({"zero_optimization": {"stage": 3,
                   "offload_param": {"device": "nvme"}}})"),
               "zero_optimization.offload_param.nvme_path",
               {"missing", "device is \"nvme\"", "zinf.nvme_paths"});
  expect_error(parse_error(R"({"zero_optimization": {"stage": 3,
                   "offload_optimizer": {"device": "nvme", "nvme_path": ""}}})"),
               "zero_optimization.offload_optimizer.nvme_path", {"missing"});
  // zinf.nvme_paths stands in for (and replaces) the blocks' nvme_path.
  RunConfig c = parse(R"({"zero_optimization": {"stage": 3,
                 "offload_param": {"device": "nvme", "nvme_path": "/ignored"},
                 "offload_optimizer": {"device": "nvme"}},
                 "zinf": {"nvme_paths": ["/a", "/b"]}})");
  EXPECT_EQ(c.zero.nvme_paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(c.zero_extra.param_nvme_path, "/ignored");
  EXPECT_EQ(c.zero.param_nvme_path, "");  // both tiers stripe across /a and /b
  EXPECT_EQ(c.zero.optimizer_nvme_path, "");
}

TEST(ParseConfigTest, BothNvmeTiersListTheirFolders) {
  RunConfig c = parse(R"({"zero_optimization": {"stage": 3,
                 "offload_param": {"device": "nvme", "nvme_path": "/p"},
                 "offload_optimizer": {"device": "nvme", "nvme_path": "/o"}}})");
  EXPECT_EQ(c.zero.nvme_paths, (std::vector<std::string>{"/p", "/o"}));
  // Each tier keeps its swap files in its own folder, as in DeepSpeed.
  EXPECT_EQ(c.zero.param_nvme_path, "/p");
  EXPECT_EQ(c.zero.optimizer_nvme_path, "/o");
  // A path given to a tier that is not on nvme is not a swap folder.
  c = parse(R"({"zero_optimization": {"stage": 3,
                 "offload_param": {"device": "cpu", "nvme_path": "/p"}}})");
  EXPECT_TRUE(c.zero.nvme_paths.empty());
}

TEST(ParseConfigTest, OffloadParamBelowStage3) {
  for (int stage : {0, 1, 2}) {
    const std::string json = R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                             R"(, "offload_param": {"device": "cpu"}}})";
    expect_error(parse_error(json), "zero_optimization.offload_param",
                 {"needs stage 3", "stage is " + std::to_string(stage)});
  }
  // device none is not an offload.
  EXPECT_NO_THROW((void)parse(R"({"zero_optimization": {"stage": 2,
                               "offload_param": {"device": "none"}}})"));
}

TEST(ParseConfigTest, OffloadOptimizerStages) {
  expect_error(parse_error(R"({"zero_optimization": {"stage": 0,
                   "offload_optimizer": {"device": "cpu"}}})"),
               "zero_optimization.offload_optimizer", {"needs stage 1, 2 or 3", "stage is 0"});
  expect_error(parse_error(R"({"zero_optimization": {"stage": 2,
                   "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})"),
               "zero_optimization.offload_optimizer.device", {"needs stage 3", "stage is 2"});
  expect_error(parse_error(R"({"zero_optimization": {"stage": 2,
                   "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})"),
               "zero_optimization.offload_optimizer.ratio", {"0.3", "needs stage 3"});
  EXPECT_NO_THROW((void)parse(R"({"zero_optimization": {"stage": 1,
                               "offload_optimizer": {"device": "cpu"}}})"));
}

TEST(ParseConfigTest, OptimizerBufferCountMustHoldTheStates) {
  expect_error(parse_error(R"({"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 3,
                   "offload_optimizer": {"device": "cpu", "buffer_count": 3}}})"),
               "zero_optimization.offload_optimizer.buffer_count",
               {"3 buffers", "4 states per parameter of Adam", "at least 4"});
  // Lion and Adagrad keep three arrays per element.
  RunConfig c = parse(R"({"optimizer": {"type": "lion"}, "zero_optimization": {"stage": 3,
                 "offload_optimizer": {"device": "cpu", "buffer_count": 3}}})");
  EXPECT_EQ(c.zero.optimizer_buffer_count, 3u);
  expect_error(parse_error(R"({"optimizer": {"type": "Adagrad"}, "zero_optimization": {
                   "stage": 3, "offload_optimizer": {"device": "cpu", "buffer_count": 2}}})"),
               "zero_optimization.offload_optimizer.buffer_count",
               {"3 states per parameter of Adagrad"});
  // Without offload DeepSpeed never uses the pool; neither does the check.
  EXPECT_NO_THROW((void)parse(R"({"zero_optimization": {"stage": 3,
                               "offload_optimizer": {"device": "none", "buffer_count": 1}}})"));
}

TEST(ParseConfigTest, ParamBuffersOnNvmeMustBeNonZero) {
  expect_error(parse_error(R"({"zero_optimization": {"stage": 3, "offload_param": {
                   "device": "nvme", "nvme_path": "/x", "buffer_count": 0}}})"),
               "zero_optimization.offload_param.buffer_count", {"0 buffers"});
  expect_error(parse_error(R"({"zero_optimization": {"stage": 3, "offload_param": {
                   "device": "nvme", "nvme_path": "/x", "buffer_size": 0}}})"),
               "zero_optimization.offload_param.buffer_size", {"0 elements"});
}

TEST(ParseConfigTest, Fp16AndBf16BothEnabled) {
  expect_error(parse_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
               "bf16.enabled", {"fp16.enabled and bf16.enabled are both true"});
  // The old block name counts the same.
  expect_error(parse_error(R"({"fp16": {"enabled": true}, "bfloat16": {"enabled": true}})"),
               "bf16.enabled", {"both true"});
  EXPECT_EQ(parse(R"({"bfloat16": {"enabled": true}})").zero.precision, Precision::kBFloat16);
}

TEST(ParseConfigTest, BatchSizesThatCannotAgreeForAnyWorldSize) {
  expect_error(parse_error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1})"),
               "train_batch_size", {"10", "4", "1", "not a multiple of 4"});
}

// ---- optimizer and scheduler --------------------------------------------------------------------

TEST(ParseConfigTest, OptimizerTypesAndDefaults) {
  RunConfig c = parse(R"({"optimizer": {"type": "adagrad"}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdagrad);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-2);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-10);
  EXPECT_EQ(c.optimizer.states_per_param(), 3);
  c = parse(R"({"optimizer": {"type": "ADAM", "params": {"adam_w_mode": false,
                                                         "torch_adam": true}}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(c.warnings.empty());
  // AdamW is decoupled whatever adam_w_mode says (DeepSpeed's rule).
  c = parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  c = parse(R"({"optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.95, 0.98],
                                                         "weight_decay": 0.1}}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::kLion);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.98);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);

  expect_error(parse_error(R"({"optimizer": {"type": "Lamb"}})"), "optimizer.type",
               {"one of \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\"", "\"Lamb\""});
  expect_error(parse_error(R"({"optimizer": {"params": {"lr": 1}}})"), "optimizer.type",
               {"missing"});
  expect_error(parse_error(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1}}})"),
               "optimizer.params.max_grad_norm", {"gradient_clipping"});
}

TEST(ParseConfigTest, SchedulerTypesAndRequiredParameters) {
  RunConfig c = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "warmup_min_lr": 1e-6, "warmup_max_lr": 1e-3, "warmup_num_steps": 50,
      "warmup_type": "linear", "total_num_steps": 1e3, "last_batch_iteration": -1}}})");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 1e-6);

  c = parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
      "cycle_max_lr": 1e-3, "cycle_first_step_size": 100, "decay_step_size": 10,
      "decay_lr_rate": 0.1, "cycle_momentum": true, "cycle_min_mom": 0.85,
      "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}}})");
  EXPECT_EQ(c.scheduler.type, SchedulerType::kOneCycle);
  EXPECT_EQ(c.scheduler.cycle_second_step_size, 0);  // the same as the first
  EXPECT_DOUBLE_EQ(c.scheduler.cycle_min_mom, 0.85);

  c = parse(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-5,
      "lr_range_test_step_size": 10, "lr_range_test_step_rate": 2, "lr_range_test_staircase": true}}})");
  EXPECT_EQ(c.scheduler.lr_range_test_step_size, 10);
  EXPECT_TRUE(c.scheduler.lr_range_test_staircase);

  expect_error(parse_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})"),
               "scheduler.params.total_num_steps", {"required by the WarmupDecayLR scheduler"});
  expect_error(parse_error(R"({"scheduler": {"type": "WarmupCosineLR"}})"),
               "scheduler.params.total_num_steps", {"required by the WarmupCosineLR"});
  expect_error(parse_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})"),
               "scheduler.params.cycle_max_lr", {"required by the OneCycle scheduler"});
  expect_error(parse_error(R"({"scheduler": {"type": "CosineAnnealing"}})"), "scheduler.type",
               {"one of \"WarmupLR\"", "\"CosineAnnealing\""});
  // A cosine phase without steps is DeepSpeed's warning, not an error: the lr stays at the
  // cosine floor after the warm-up.
  c = parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
                   "total_num_steps": 100, "warmup_num_steps": 100}}})");
  EXPECT_TRUE(has_warning(c, {"scheduler.params.total_num_steps",
                              "100 is not more than the "
                              "warm-up (100 steps",
                              "cos_min_ratio"}));
  expect_error(parse_error(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
                   "total_num_steps": 1000, "warmup_type": "cubic"}}})"),
               "scheduler.params.warmup_type", {"\"log\" or \"linear\"", "\"cubic\""});
  c = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
                "warmup_num_steps": 20}}})");
  EXPECT_TRUE(has_warning(c, {"scheduler.params.total_num_steps",
                              "10 is less than "
                              "warmup_num_steps 20"}));
  // WarmupLR falls back to log with a warning, as DeepSpeed does.
  c = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})");
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLog);
  EXPECT_TRUE(has_warning(c, {"scheduler.params.warmup_type", "\"cubic\"", "\"log\""}));
}

// ---- unknown and unsupported keys
// ----------------------------------------------------------------

TEST(ParseConfigTest, UnknownKeysGiveOneWarningEachWithTheirPath) {
  RunConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1, "stps_per_print": 5,
      "zero_optimization": {"stage": 3, "reduce_bucket_sise": 5, "offload_param": {
          "device": "cpu", "pin_memroy": true}},
      "aio": {"queue_depht": 4}, "zinf": {"threds": 2, "mystery": 1},
      "fp16": {"enabled": false, "initial_scale": 3}})");
  EXPECT_EQ(c.warnings.size(), 7u);
  EXPECT_TRUE(has_warning(c, {"test.json: stps_per_print", "did you mean \"steps_per_print\""}));
  EXPECT_TRUE(has_warning(c, {"zero_optimization.reduce_bucket_sise", "\"reduce_bucket_size\""}));
  EXPECT_TRUE(has_warning(c, {"zero_optimization.offload_param.pin_memroy", "\"pin_memory\""}));
  EXPECT_TRUE(has_warning(c, {"aio.queue_depht", "\"queue_depth\""}));
  EXPECT_TRUE(has_warning(c, {"zinf.threds", "\"threads\""}));
  EXPECT_TRUE(has_warning(c, {"zinf.mystery", "unknown key, ignored"}));
  EXPECT_TRUE(has_warning(c, {"fp16.initial_scale", "unknown key"}));
  // The values of the misspelt keys are not used.
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000u);
}

TEST(ParseConfigTest, UnsupportedDeepSpeedFeaturesWarnOnlyWhenSwitchedOn) {
  RunConfig c = parse(R"({"tensorboard": {"enabled": true, "output_path": "tb"},
      "wandb": {"enabled": false}, "zero_optimization": {"stage": 3,
      "round_robin_gradients": true, "zero_quantized_weights": false,
      "zero_hpz_partition_size": 1}, "amp": {"enabled": false},
      "zero_allow_untested_optimizer": true, "activation_checkpointing": {
      "partition_activations": true}})");
  EXPECT_EQ(c.warnings.size(), 3u);
  EXPECT_TRUE(has_warning(c, {"tensorboard.enabled", "not supported", "csv_monitor"}));
  EXPECT_TRUE(has_warning(c, {"zero_optimization.round_robin_gradients", "not supported"}));
  EXPECT_TRUE(has_warning(c, {"activation_checkpointing", "ZeroBlock"}));
}

// DeepSpeed's activation_checkpointing block as configs carry it: read and type-checked, quiet
// when nothing in it asks for what zinf does not do, one warning per switch that does.
TEST(ParseConfigTest, ActivationCheckpointingWarnsOnlyForSwitchesZinfDoesNotHonour) {
  RunConfig quiet = parse(R"({"activation_checkpointing": {"partition_activations": false,
      "cpu_checkpointing": false, "contiguous_memory_optimization": false,
      "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
      "profile": false}})");
  EXPECT_TRUE(quiet.warnings.empty()) << quiet.warnings.front();
  EXPECT_EQ(quiet.zero.activation_offload, OffloadTarget::kNone);
  RunConfig c = parse(R"({"activation_checkpointing": {"partition_activations": true,
      "number_checkpoints": 24, "contiguous_memory_optimization": true, "profle": true}})");
  EXPECT_EQ(c.warnings.size(), 3u);
  EXPECT_TRUE(has_warning(c, {"activation_checkpointing.partition_activations", "ZeroBlock"}));
  EXPECT_TRUE(has_warning(c, {"activation_checkpointing.contiguous_memory_optimization"}));
  EXPECT_TRUE(has_warning(c, {"activation_checkpointing.profle", "did you mean \"profile\""}));
  expect_error(parse_error(R"({"activation_checkpointing": {"cpu_checkpointing": "yes"}})"),
               "activation_checkpointing.cpu_checkpointing", {"\"yes\""});
  expect_error(parse_error(R"({"activation_checkpointing": {"number_checkpoints": -1}})"),
               "activation_checkpointing.number_checkpoints", {"-1"});
}

// Where the layers' saved inputs wait for the backward: zinf.activation_offload, else
// DeepSpeed's cpu_checkpointing (pinned CPU memory); on NVMe in a swap folder of the config.
TEST(ParseConfigTest, ActivationOffloadFromZinfOrFromCpuCheckpointing) {
  RunConfig ds = parse(R"({"activation_checkpointing": {"cpu_checkpointing": true}})");
  EXPECT_EQ(ds.zero.activation_offload, OffloadTarget::kCpu);
  EXPECT_TRUE(ds.warnings.empty()) << ds.warnings.front();
  EXPECT_EQ(parse(R"({"zinf": {"activation_offload": "cpu"}})").zero.activation_offload,
            OffloadTarget::kCpu);
  RunConfig both = parse(R"({"activation_checkpointing": {"cpu_checkpointing": true},
      "zinf": {"activation_offload": "none"}})");
  EXPECT_EQ(both.zero.activation_offload, OffloadTarget::kNone);
  EXPECT_TRUE(has_warning(both, {"activation_checkpointing.cpu_checkpointing",
                                 "zinf.activation_offload \"none\" decides"}));

  RunConfig nvme = parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
      "nvme_path": "/mnt/p"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/o"}},
      "zinf": {"activation_offload": "nvme"}})");
  EXPECT_EQ(nvme.zero.activation_offload, OffloadTarget::kNvme);
  EXPECT_EQ(nvme.zero.activation_nvme_path, "/mnt/p");
  EXPECT_EQ(nvme.zero.optimizer_nvme_path, "/mnt/o");
  RunConfig striped = parse(R"({"zinf": {"activation_offload": "nvme",
      "nvme_paths": ["/mnt/a", "/mnt/b"]}})");
  EXPECT_EQ(striped.zero.activation_nvme_path, "");
  EXPECT_EQ(striped.zero.nvme_paths, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));

  expect_error(parse_error(R"({"zinf": {"activation_offload": "nvme"}})"),
               "zinf.activation_offload", {"needs a swap folder", "offload_param.nvme_path"});
  expect_error(parse_error(R"({"zinf": {"activation_offload": "disk"}})"),
               "zinf.activation_offload", {"\"disk\"", "nvme"});
}

// zinf.overlap_optimizer: on by default where the optimizer is on NVMe, off on the CPU tier
// (its undo copies cost host memory); either way when given.
TEST(ParseConfigTest, OverlapOptimizerDefaultsOnForNvmeOnly) {
  const char* nvme = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/mnt/o"}})";
  const char* cpu = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}})";
  EXPECT_TRUE(parse(fmt::format("{{{}}}", nvme)).zero.overlap_optimizer);
  EXPECT_FALSE(parse(fmt::format("{{{}}}", cpu)).zero.overlap_optimizer);
  EXPECT_FALSE(parse("{}").zero.overlap_optimizer);
  EXPECT_FALSE(parse(fmt::format("{{{}}}", nvme)).zero.overlap_optimizer_given);
  EXPECT_FALSE(parse(fmt::format(R"({{{}, "zinf": {{"overlap_optimizer": false}}}})", nvme))
                   .zero.overlap_optimizer);
  EXPECT_TRUE(parse(fmt::format(R"({{{}, "zinf": {{"overlap_optimizer": true}}}})", cpu))
                  .zero.overlap_optimizer);
  EXPECT_TRUE(parse(fmt::format(R"({{{}, "zinf": {{"overlap_optimizer": true}}}})", cpu))
                  .zero.overlap_optimizer_given);
  expect_error(parse_error(R"({"zinf": {"overlap_optimizer": "yes"}})"), "zinf.overlap_optimizer",
               {"\"yes\""});
}

// zinf.grad_offload: with the optimizer on NVMe the grads accumulate in host memory unless the
// key says "nvme" (the engine turns the default off where it does not fit); "nvme" without
// the optimizer on NVMe is refused, naming the key and the device.
TEST(ParseConfigTest, GradOffloadDefaultsToHostMemoryWithTheOptimizerOnNvme) {
  const char* nvme = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/mnt/o"}})";
  const char* cpu = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}})";
  EXPECT_TRUE(parse(fmt::format("{{{}}}", nvme)).zero.host_grads);
  EXPECT_FALSE(parse(fmt::format("{{{}}}", nvme)).zero.host_grads_given);
  EXPECT_FALSE(parse(fmt::format("{{{}}}", cpu)).zero.host_grads);  // (in memory already)
  EXPECT_FALSE(parse("{}").zero.host_grads);
  const RunConfig on_disk =
      parse(fmt::format(R"({{{}, "zinf": {{"grad_offload": "nvme"}}}})", nvme));
  EXPECT_FALSE(on_disk.zero.host_grads);
  EXPECT_TRUE(on_disk.zero.host_grads_given);
  EXPECT_TRUE(parse(fmt::format(R"({{{}, "zinf": {{"grad_offload": "cpu"}}}})", nvme))
                  .zero.host_grads_given);
  EXPECT_FALSE(
      parse(fmt::format(R"({{{}, "zinf": {{"grad_offload": "cpu"}}}})", cpu)).zero.host_grads);
  expect_error(parse_error(fmt::format(R"({{{}, "zinf": {{"grad_offload": "nvme"}}}})", cpu)),
               "zinf.grad_offload", {"\"nvme\"", "offload_optimizer.device", "\"cpu\""});
  expect_error(parse_error(R"({"zinf": {"grad_offload": "cpu"}})"), "zinf.grad_offload",
               {"\"none\""});
  expect_error(parse_error(R"({"zinf": {"grad_offload": "disk"}})"), "zinf.grad_offload",
               {"\"disk\""});
}

TEST(ParseConfigTest, DeprecatedCpuOffloadFlags) {
  RunConfig c = parse(R"({"zero_optimization": {"stage": 3, "cpu_offload": true,
                                               "cpu_offload_param": true}})");
  EXPECT_EQ(c.zero.offload_optimizer, OffloadTarget::kCpu);
  EXPECT_EQ(c.zero.offload_param, OffloadTarget::kCpu);
  EXPECT_TRUE(has_warning(c, {"zero_optimization.cpu_offload", "deprecated"}));
}

// ---- aio, monitoring, checkpoint ---------------------------------------------------------------

TEST(ParseConfigTest, AioBlock) {
  RunConfig c = parse(R"({"aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2,
      "single_submit": true, "overlap_events": false, "backend": "psync"}})");
  EXPECT_EQ(c.zero.aio.block_size, 262144u);
  EXPECT_EQ(c.zero.aio.queue_depth, 32);
  EXPECT_EQ(c.zero.aio.intra_op_parallelism, 2);
  EXPECT_TRUE(c.zero.aio.single_submit);
  EXPECT_FALSE(c.zero.aio.overlap_events);
  EXPECT_EQ(c.zero.aio.backend, aio::BackendKind::kPsync);
  expect_error(parse_error(R"({"aio": {"block_size": 1000}})"), "aio", {"block_size"});
  expect_error(parse_error(R"({"aio": {"queue_depth": 0}})"), "aio.queue_depth", {"[1, 4096]"});
  expect_error(parse_error(R"({"aio": {"backend": "spdk"}})"), "aio.backend",
               {"\"io_uring\", \"libaio\", \"psync\""});
  expect_error(parse_error(R"({"aio": {"use_gds": true}})"), "aio.use_gds",
               {"no GPUDirect Storage"});
  EXPECT_NO_THROW((void)parse(R"({"aio": {"use_gds": false}})"));
}

TEST(ParseConfigTest, CsvMonitorCheckpointAndTopLevelScalars) {
  RunConfig c = parse(R"({"csv_monitor": {"enabled": true, "output_path": "logs/",
      "job_name": "run1"}, "checkpoint": {"tag_validation": "FAIL", "load_universal": true},
      "wall_clock_breakdown": true, "communication_data_type": "BF16",
      "prescale_gradients": true, "gradient_predivide_factor": 2.0, "dump_state": false})");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "logs/");
  EXPECT_EQ(c.csv_monitor.job_name, "run1");
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");
  EXPECT_TRUE(c.checkpoint.load_universal);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.zero.communication_data_type, "bf16");
  EXPECT_TRUE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 2.0);
  expect_error(parse_error(R"({"communication_data_type": "int8"})"), "communication_data_type",
               {"\"fp32\", \"fp16\", \"bf16\""});
  expect_error(parse_error(R"({"steps_per_print": 0})"), "steps_per_print", {">= 1"});
}

// ---- the zinf object
// ------------------------------------------------------------------------------

TEST(ParseConfigTest, ZinfObject) {
  RunConfig c = parse(R"({"zinf": {"accelerator": {"type": "cpu", "memory_budget": "8GB"},
      "comm_timeout_s": 12.5, "io_timeout_s": 60, "nvme_paths": ["/n0", "/n1"],
      "swap_checksums": false, "pinned_memory_limit": "2GiB", "threads": 2,
      "comm_backend": "gloo"}})");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.zinf.accelerator, AcceleratorType::kCpu);
  EXPECT_EQ(c.zinf.memory_budget_bytes, 8'000'000'000u);
  EXPECT_DOUBLE_EQ(c.zinf.comm_timeout_s, 12.5);
  EXPECT_EQ(c.zero.comm_timeout.count(), 12'500);
  EXPECT_DOUBLE_EQ(c.zinf.io_timeout_s, 60.0);
  EXPECT_DOUBLE_EQ(c.zero.aio.io_timeout_s, 60.0);  // reaches every aio handle
  EXPECT_EQ(c.zinf.nvme_paths, (std::vector<std::string>{"/n0", "/n1"}));
  EXPECT_FALSE(c.zinf.swap_checksums);
  EXPECT_FALSE(c.zero.swap_checksums);
  EXPECT_EQ(c.zinf.pinned_memory_limit_bytes, 2ull << 30);
  EXPECT_EQ(c.zero.pinned_memory_limit, 2ull << 30);
  EXPECT_EQ(c.zinf.threads, 2);
  EXPECT_EQ(c.zinf.comm_backend, "gloo");

  EXPECT_EQ(
      parse(R"({"zinf": {"accelerator": {"memory_budget": "8GiB"}}})").zinf.memory_budget_bytes,
      8ull << 30);
  EXPECT_EQ(parse(R"({"zinf": {"accelerator": {"memory_budget": 8e9}}})").zinf.memory_budget_bytes,
            8'000'000'000u);
  EXPECT_EQ(parse(R"({"zinf": {"accelerator": {"type": "CUDA"}}})").zinf.accelerator,
            AcceleratorType::kCuda);
  expect_error(parse_error(R"({"zinf": {"accelerator": {"memory_budget": "eight gigs"}}})"),
               "zinf.accelerator.memory_budget", {"a byte size", "\"eight gigs\""});
  expect_error(parse_error(R"({"zinf": {"accelerator": {"memory_budget": 0}}})"),
               "zinf.accelerator.memory_budget", {"more than 0 bytes"});
  expect_error(parse_error(R"({"zinf": {"accelerator": {"type": "tpu"}}})"),
               "zinf.accelerator.type", {"\"auto\", \"cpu\", \"cuda\"", "\"tpu\""});
  expect_error(parse_error(R"({"zinf": {"nvme_paths": "/mnt/nvme"}})"), "zinf.nvme_paths",
               {"list of folder paths", "\"/mnt/nvme\""});
  expect_error(parse_error(R"({"zinf": {"nvme_paths": []}})"), "zinf.nvme_paths",
               {"non-empty list"});
  expect_error(parse_error(R"({"zinf": {"comm_timeout_s": 0}})"), "zinf.comm_timeout_s", {"got 0"});
}

TEST(ParseConfigTest, ByteSizes) {
  using detail::parse_byte_size;
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("8GB"), 8'000'000'000u);
  EXPECT_EQ(parse_byte_size("8 GiB"), 8ull << 30);
  EXPECT_EQ(parse_byte_size("8g"), 8ull << 30);
  EXPECT_EQ(parse_byte_size("1.5MiB"), 3ull << 19);
  EXPECT_EQ(parse_byte_size("512K"), 512ull << 10);
  EXPECT_EQ(parse_byte_size("1e9"), 1'000'000'000u);
  EXPECT_EQ(parse_byte_size("2e3KB"), 2'000'000u);
  EXPECT_FALSE(parse_byte_size(""));
  EXPECT_FALSE(parse_byte_size("-1GB"));
  EXPECT_FALSE(parse_byte_size("8XB"));
  EXPECT_FALSE(parse_byte_size("0.3B"));
  EXPECT_FALSE(parse_byte_size("GB"));
  EXPECT_FALSE(parse_byte_size("1e30"));
}

// ---- the file itself
// ------------------------------------------------------------------------------

TEST(ParseConfigTest, FileErrorsNameTheFile) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string missing = dir.file("missing.json");
  ConfigError e = testing::error_of([&] { (void)parse_config(missing); });
  EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();

  const std::string broken = dir.file("broken.json");
  std::ofstream(broken) << "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n}\n,}";
  e = testing::error_of([&] { (void)parse_config(broken); });
  EXPECT_EQ(e.source(), broken);
  EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("line 5"), std::string::npos) << e.what();

  expect_error(parse_error("[1, 2]"), "", {"top level must be a JSON object"});
  // Messages start with the source name.
  e = parse_error(R"({"zero_optimization": {"stage": 9}})");
  EXPECT_EQ(std::string(e.what()).rfind("test.json: zero_optimization.stage: ", 0), 0u) << e.what();
}

}  // namespace
}  // namespace zinf::config
