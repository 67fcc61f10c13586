// parse_config(): DeepSpeed's JSON schema, block by block, into RunConfig. The order below is
// the order of DeepSpeed's documentation page; the rules that involve several blocks run at
// the end, once everything is read. One file over 800 lines because it is one schema: each
// block's parser is short, and the cross-block rules need every block read.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "engine/config/json_reader.h"
#include "engine/config/lr_schedule.h"
#include "engine/config/run_config.h"

namespace zinf::config {

using detail::Json;
using detail::JsonBlock;
using detail::ParseContext;

ConfigError::ConfigError(const std::string& source, const std::string& path,
                         const std::string& reason)
    : std::runtime_error(path.empty() ? fmt::format("{}: {}", source, reason)
                                      : fmt::format("{}: {}: {}", source, path, reason)),
      source_(source),
      path_(path),
      reason_(reason) {}

std::string_view to_string(SchedulerType type) {
  switch (type) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kOneCycle:
      return "OneCycle";
    case SchedulerType::kLRRangeTest:
      return "LRRangeTest";
  }
  return "?";
}

std::string_view to_string(AcceleratorType type) {
  switch (type) {
    case AcceleratorType::kAuto:
      return "auto";
    case AcceleratorType::kCpu:
      return "cpu";
    case AcceleratorType::kCuda:
      return "cuda";
    case AcceleratorType::kStrict:
      return "strict";
  }
  return "?";
}

int OptimizerConfig::states_per_param() const noexcept {
  return 2 + optimizer_cpu::state_arrays(type).count();
}

namespace {

constexpr double kMaxDouble = std::numeric_limits<double>::max();
// DeepSpeed's value for an absent "gradient_clipping" (constants.py GRADIENT_CLIPPING_DEFAULT
// in the 0.19.8 the project compares with, since DeepSpeed's PR 8068; 0 = off before it): a
// config means the same under both.
constexpr double kDeepSpeedGradientClipping = 1.0;
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// ---- batch and top-level scalars --------------------------------------------------------------

std::optional<int64_t> batch_value(JsonBlock& top, std::string_view key) {
  if (top.take_auto(key) || !top.has(key)) return std::nullopt;
  return top.integer(key, 0, 1, kMaxInt);
}

void parse_batch(JsonBlock& top, RunConfig& c) {
  c.batch.train_batch_size = batch_value(top, "train_batch_size");
  c.batch.micro_batch_per_gpu = batch_value(top, "train_micro_batch_size_per_gpu");
  c.batch.gradient_accumulation_steps = batch_value(top, "gradient_accumulation_steps");
  const BatchConfig& b = c.batch;
  // All three given: the world size is not known yet, but a train_batch_size that is not a
  // multiple of micro x accumulation disagrees for every world size.
  if (b.train_batch_size && b.micro_batch_per_gpu && b.gradient_accumulation_steps) {
    const int64_t per_rank = *b.micro_batch_per_gpu * *b.gradient_accumulation_steps;
    if (*b.train_batch_size % per_rank != 0) {
      top.context().fail(
          "train_batch_size",
          fmt::format("train_batch_size {} must equal train_micro_batch_size_per_gpu {} x "
                      "gradient_accumulation_steps {} x world size, and {} is not a multiple "
                      "of {}",
                      *b.train_batch_size, *b.micro_batch_per_gpu, *b.gradient_accumulation_steps,
                      *b.train_batch_size, per_rank));
    }
  }
  if (b.gradient_accumulation_steps) {
    c.zero.gradient_accumulation_steps = static_cast<int>(*b.gradient_accumulation_steps);
  }
}

void parse_top_scalars(JsonBlock& top, RunConfig& c) {
  if (!top.take_auto("gradient_clipping")) {
    c.zero.gradient_clipping =
        top.number("gradient_clipping", kDeepSpeedGradientClipping, 0.0, kMaxDouble);
  }
  c.steps_per_print = static_cast<int>(
      top.integer("steps_per_print", c.steps_per_print, 1, std::numeric_limits<int>::max()));
  c.wall_clock_breakdown = top.boolean("wall_clock_breakdown", false);
  c.prescale_gradients = top.boolean("prescale_gradients", false);
  c.gradient_predivide_factor =
      top.number("gradient_predivide_factor", 1.0, std::numeric_limits<double>::min(), kMaxDouble);
  static const std::vector<std::string_view> kTypes = {"fp32", "fp16", "bf16"};
  if (top.has("communication_data_type")) {
    c.zero.communication_data_type = kTypes[top.choice("communication_data_type", kTypes, 0)];
  }
}

// ---- precision ----------------------------------------------------------------------------------

void parse_fp16(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("fp16");
  if (!b) return;
  if (!b->take_auto("enabled")) c.precision.fp16_enabled = b->boolean("enabled", false);
  c.precision.fp16_auto_cast = b->boolean("auto_cast", false);
  zero::LossScaleConfig& s = c.zero.loss_scale;
  s.loss_scale = b->number("loss_scale", s.loss_scale, 0.0, kMaxDouble);
  s.initial_scale_power =
      static_cast<int>(b->integer("initial_scale_power", s.initial_scale_power, 0, 127));
  s.loss_scale_window = static_cast<int>(
      b->integer("loss_scale_window", s.loss_scale_window, 1, std::numeric_limits<int>::max()));
  s.hysteresis =
      static_cast<int>(b->integer("hysteresis", s.hysteresis, 1, std::numeric_limits<int>::max()));
  s.consecutive_hysteresis = b->boolean("consecutive_hysteresis", s.consecutive_hysteresis);
  s.min_loss_scale =
      b->number("min_loss_scale", s.min_loss_scale, std::numeric_limits<double>::min(), kMaxDouble);
  b->unsupported("fp16_master_weights_and_grads", false,
                 "the master weights are always fp32 in zinf");
  b->finish({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
             "hysteresis", "consecutive_hysteresis", "min_loss_scale",
             "fp16_master_weights_and_grads"});
}

void parse_bf16(JsonBlock& top, RunConfig& c) {
  // "bfloat16" is DeepSpeed's old name of the block; "bf16" wins when both are there.
  std::string_view key = top.has("bf16") || !top.has("bfloat16") ? "bf16" : "bfloat16";
  if (key == "bf16" && top.has("bfloat16")) {
    (void)top.take("bfloat16");
    top.context().warn("bfloat16", "ignored: the \"bf16\" block is used (DeepSpeed's rule)");
  }
  std::optional<JsonBlock> b = top.block(key);
  if (!b) return;
  if (!b->take_auto("enabled")) c.precision.bf16_enabled = b->boolean("enabled", false);
  b->accept({"immediate_grad_update", "check_grad_overflow"});
  b->finish({"enabled", "immediate_grad_update", "check_grad_overflow"});
}

// ---- optimizer and scheduler --------------------------------------------------------------------

void parse_betas(JsonBlock& params, OptimizerConfig& o) {
  const Json* betas = params.take("betas");
  if (betas == nullptr) return;
  const bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() &&
                  (*betas)[1].is_number() && (*betas)[0].get<double>() >= 0.0 &&
                  (*betas)[0].get<double>() < 1.0 && (*betas)[1].get<double>() >= 0.0 &&
                  (*betas)[1].get<double>() < 1.0;
  if (!ok) {
    params.context().fail(params.path_of("betas"),
                          fmt::format("expected two numbers in [0, 1) such as [0.9, 0.999], got {}",
                                      detail::describe(*betas)));
  }
  o.beta1 = (*betas)[0].get<double>();
  o.beta2 = (*betas)[1].get<double>();
}

void parse_optimizer(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("optimizer");
  if (!b) return;
  OptimizerConfig& o = c.optimizer;
  o.given = true;
  if (!b->has("type")) {
    top.context().fail(b->path_of("type"),
                       "missing; supported types: \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\"");
  }
  static const std::vector<std::string_view> kTypes = {"Adam", "AdamW", "Adagrad", "Lion"};
  o.type = static_cast<OptimizerType>(b->choice("type", kTypes, 1));
  if (o.type == OptimizerType::kAdagrad) {
    o.lr = 1e-2;  // DeepSpeedCPUAdagrad's defaults
    o.eps = 1e-10;
  }
  b->accept({"legacy_fusion"});
  std::optional<JsonBlock> p = b->block("params");
  b->finish({"type", "params", "legacy_fusion"});
  if (!p) return;
  if (!p->take_auto("lr")) o.lr = p->number("lr", o.lr, 0.0, kMaxDouble);
  if (!p->take_auto("betas")) parse_betas(*p, o);
  if (!p->take_auto("eps")) o.eps = p->number("eps", o.eps, 0.0, kMaxDouble);
  if (!p->take_auto("weight_decay")) {
    o.weight_decay = p->number("weight_decay", o.weight_decay, 0.0, kMaxDouble);
  }
  o.bias_correction = p->boolean("bias_correction", o.bias_correction);
  o.adam_w_mode = p->boolean("adam_w_mode", true);
  if (o.type == OptimizerType::kAdamW) o.adam_w_mode = true;  // DeepSpeed ignores the key here
  if (p->has("max_grad_norm")) {
    top.context().fail(p->path_of("max_grad_norm"),
                       "not an optimizer parameter in DeepSpeed; use the top-level "
                       "\"gradient_clipping\" key");
  }
  if (o.type == OptimizerType::kAdagrad && p->has("betas")) {
    top.context().warn(p->path_of("betas"), "Adagrad has no betas; ignored");
  }
  p->accept({"torch_adam", "fp32_optimizer_states"});
  p->unsupported("amsgrad", false, "");
  p->finish({"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam",
             "amsgrad", "fp32_optimizer_states"});
}

// A scheduler parameter that HF-style configs may write "auto".
void step_count(JsonBlock& p, std::string_view key, int64_t& field) {
  if (!p.take_auto(key)) field = p.integer(key, field, 0, kMaxInt);
}
void lr_value(JsonBlock& p, std::string_view key, double& field) {
  if (!p.take_auto(key)) field = p.number(key, field, 0.0, kMaxDouble);
}

void parse_warmup_type(JsonBlock& p, SchedulerConfig& s, bool strict) {
  const Json* value = p.take("warmup_type");
  if (value == nullptr) return;
  if (value->is_string() && value->get_ref<const std::string&>() == "log") {
    s.warmup_type = WarmupType::kLog;
  } else if (value->is_string() && value->get_ref<const std::string&>() == "linear") {
    s.warmup_type = WarmupType::kLinear;
  } else if (strict) {
    p.context().fail(p.path_of("warmup_type"), fmt::format("expected \"log\" or \"linear\", got {}",
                                                           detail::describe(*value)));
  } else {
    // DeepSpeed's WarmupLR warns and falls back to log; the same here.
    p.context().warn(p.path_of("warmup_type"),
                     fmt::format("{} is not \"log\" or \"linear\"; using \"log\" as DeepSpeed does",
                                 detail::describe(*value)));
    s.warmup_type = WarmupType::kLog;
  }
}

void require(JsonBlock& p, std::string_view key, std::string_view type) {
  if (!p.has(key)) {
    p.context().fail(p.path_of(key), fmt::format("required by the {} scheduler", type));
  }
}

void parse_scheduler_params(JsonBlock& p, SchedulerConfig& s) {
  std::vector<std::string_view> known = {"last_batch_iteration"};
  const Json* last = p.take("last_batch_iteration");
  if (last != nullptr && *last != Json(-1)) {
    p.context().warn(p.path_of("last_batch_iteration"),
                     fmt::format("{} ignored: the schedule starts at the beginning (a resumed run "
                                 "takes its position from the checkpoint)",
                                 detail::describe(*last)));
  }
  const std::string_view name = to_string(s.type);
  switch (s.type) {
    case SchedulerType::kWarmupDecayLR:
      if (!p.has("total_num_steps")) require(p, "total_num_steps", name);
      step_count(p, "total_num_steps", s.total_num_steps);
      known.push_back("total_num_steps");
      [[fallthrough]];
    case SchedulerType::kWarmupLR:
      lr_value(p, "warmup_min_lr", s.warmup_min_lr);
      if (!p.take_auto("warmup_max_lr") && p.has("warmup_max_lr")) {
        s.warmup_max_lr = p.number("warmup_max_lr", 0.0, 0.0, kMaxDouble);
      }
      step_count(p, "warmup_num_steps", s.warmup_num_steps);
      parse_warmup_type(p, s, /*strict=*/false);
      known.insert(known.end(),
                   {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
      break;
    case SchedulerType::kWarmupCosineLR:
      require(p, "total_num_steps", name);
      step_count(p, "total_num_steps", s.total_num_steps);
      s.warmup_min_ratio = p.number("warmup_min_ratio", s.warmup_min_ratio, 0.0, kMaxDouble);
      s.cos_min_ratio = p.number("cos_min_ratio", s.cos_min_ratio, 0.0, kMaxDouble);
      step_count(p, "warmup_num_steps", s.warmup_num_steps);
      parse_warmup_type(p, s, /*strict=*/true);
      known.insert(known.end(), {"total_num_steps", "warmup_min_ratio", "cos_min_ratio",
                                 "warmup_num_steps", "warmup_type"});
      break;
    case SchedulerType::kOneCycle:
      require(p, "cycle_min_lr", name);
      require(p, "cycle_max_lr", name);
      s.cycle_min_lr = p.number("cycle_min_lr", 0.0, 0.0, kMaxDouble);
      s.cycle_max_lr = p.number("cycle_max_lr", 0.0, 0.0, kMaxDouble);
      s.decay_lr_rate = p.number("decay_lr_rate", s.decay_lr_rate, 0.0, kMaxDouble);
      s.cycle_first_step_size =
          p.integer("cycle_first_step_size", s.cycle_first_step_size, 1, kMaxInt);
      s.cycle_second_step_size = p.integer("cycle_second_step_size", 0, 0, kMaxInt);
      s.cycle_first_stair_count =
          p.integer("cycle_first_stair_count", s.cycle_first_stair_count, 0, kMaxInt);
      s.cycle_second_stair_count =
          p.integer("cycle_second_stair_count", s.cycle_first_stair_count, 0, kMaxInt);
      s.decay_step_size = p.integer("decay_step_size", s.decay_step_size, 0, kMaxInt);
      s.cycle_momentum = p.boolean("cycle_momentum", s.cycle_momentum);
      s.cycle_min_mom = p.number("cycle_min_mom", s.cycle_min_mom, 0.0, 1.0);
      s.cycle_max_mom = p.number("cycle_max_mom", s.cycle_max_mom, 0.0, 1.0);
      s.decay_mom_rate = p.number("decay_mom_rate", s.decay_mom_rate, 0.0, kMaxDouble);
      known.insert(known.end(),
                   {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                    "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
                    "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
                    "decay_mom_rate"});
      break;
    case SchedulerType::kLRRangeTest:
      s.lr_range_test_min_lr =
          p.number("lr_range_test_min_lr", s.lr_range_test_min_lr, 0.0, kMaxDouble);
      s.lr_range_test_step_size =
          p.integer("lr_range_test_step_size", s.lr_range_test_step_size, 1, kMaxInt);
      s.lr_range_test_step_rate =
          p.number("lr_range_test_step_rate", s.lr_range_test_step_rate, 0.0, kMaxDouble);
      s.lr_range_test_staircase = p.boolean("lr_range_test_staircase", s.lr_range_test_staircase);
      known.insert(known.end(), {"lr_range_test_min_lr", "lr_range_test_step_size",
                                 "lr_range_test_step_rate", "lr_range_test_staircase"});
      break;
    case SchedulerType::kNone:
      break;
  }
  p.finish(known);
}

void parse_scheduler(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("scheduler");
  if (!b) return;
  static const std::vector<std::string_view> kTypes = {"WarmupLR", "WarmupDecayLR",
                                                       "WarmupCosineLR", "OneCycle", "LRRangeTest"};
  if (!b->has("type")) {
    top.context().fail(b->path_of("type"),
                       "missing; supported types: WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                       "OneCycle, LRRangeTest");
  }
  c.scheduler.type = static_cast<SchedulerType>(1 + b->choice("type", kTypes, 0));
  std::optional<JsonBlock> p = b->block("params");
  b->finish({"type", "params"});
  if (p) {
    parse_scheduler_params(*p, c.scheduler);
  } else {
    // Required parameters are missing when there is no params block at all.
    Json empty = Json::object();
    JsonBlock none(empty, b->path_of("params"), top.context());
    parse_scheduler_params(none, c.scheduler);
  }
  // Rules between the parameters (WarmupCosineLR's total vs warmup) once no "auto" is left.
  const bool pending =
      std::any_of(top.context().auto_keys.begin(), top.context().auto_keys.end(),
                  [](const std::string& key) { return key.rfind("scheduler.", 0) == 0; });
  if (pending) return;
  check_scheduler(c.scheduler, top.context().source);
  if (std::optional<std::string> warning = scheduler_warning(c.scheduler)) {
    top.context().warn("scheduler.params.total_num_steps", *warning);
  }
}

// ---- zero_optimization --------------------------------------------------------------------------

// DeepSpeed names several stage-3 keys both with and without the "stage3_" prefix.
std::string_view alias_key(JsonBlock& z, std::string_view name, std::string_view alias) {
  if (z.has(name) && z.has(alias)) {
    z.context().fail(z.path_of(alias), fmt::format("given twice, also as \"{}\": keep one", name));
  }
  return z.has(alias) ? alias : name;
}

// An element count that may be "auto", under its stage3_ name or DeepSpeed's alias; an "auto"
// is recorded under the stage3_ name whichever spelling the file used.
uint64_t auto_count(JsonBlock& z, std::string_view name, std::string_view alias,
                    uint64_t fallback) {
  const std::string_view key = alias.empty() ? name : alias_key(z, name, alias);
  if (z.take_auto(key)) {
    if (key != name) {
      z.context().auto_keys.erase(z.path_of(key));
      z.context().auto_keys.insert(z.path_of(name));
    }
    return fallback;
  }
  return z.count(key, fallback);
}

zero::OffloadTarget parse_device(JsonBlock& b) {
  static const std::vector<std::string_view> kDevices = {"none", "cpu", "nvme"};
  return static_cast<zero::OffloadTarget>(b.choice("device", kDevices, 0));
}

void parse_offload_param(JsonBlock& z, RunConfig& c) {
  std::optional<JsonBlock> b = z.block("offload_param");
  if (!b) return;
  c.zero.offload_param = parse_device(*b);
  c.zero_extra.param_nvme_path = b->string("nvme_path", "");
  c.zero.param_buffer_count = static_cast<size_t>(
      b->integer("buffer_count", static_cast<int64_t>(c.zero.param_buffer_count), 0, 1 << 20));
  c.zero.param_buffer_size = b->count("buffer_size", c.zero.param_buffer_size);
  c.zero.param_max_in_cpu = b->count("max_in_cpu", c.zero.param_max_in_cpu);
  c.zero_extra.param_pin_memory = b->boolean("pin_memory", false);
  b->finish({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"});
}

void parse_offload_optimizer(JsonBlock& z, RunConfig& c) {
  std::optional<JsonBlock> b = z.block("offload_optimizer");
  if (!b) return;
  c.zero.offload_optimizer = parse_device(*b);
  c.zero_extra.optimizer_nvme_path = b->string("nvme_path", "");
  const int64_t buffers =
      b->integer("buffer_count", static_cast<int64_t>(c.zero.optimizer_buffer_count), 0, 1 << 20);
  // DeepSpeed uses the pool only when the states are offloaded; so does the check below.
  if (c.zero.offload_optimizer != zero::OffloadTarget::kNone) {
    c.zero.optimizer_buffer_count = static_cast<size_t>(buffers);
  }
  c.zero_extra.optimizer_pin_memory = b->boolean("pin_memory", false);
  c.zero.pipeline_read = b->boolean("pipeline_read", false);
  c.zero.pipeline_write = b->boolean("pipeline_write", false);
  c.zero_extra.fast_init = b->boolean("fast_init", false);
  c.zero_extra.offload_ratio = b->number("ratio", 1.0, 0.0, 1.0);
  b->finish({"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
             "fast_init", "ratio"});
}

// DeepSpeed's deprecated booleans that predate the offload blocks.
void parse_legacy_offload(JsonBlock& z, RunConfig& c) {
  if (z.boolean("cpu_offload", false)) {
    z.context().warn(z.path_of("cpu_offload"),
                     "deprecated; read as offload_optimizer.device \"cpu\"");
    if (c.zero.offload_optimizer == zero::OffloadTarget::kNone) {
      c.zero.offload_optimizer = zero::OffloadTarget::kCpu;
    }
  }
  if (z.boolean("cpu_offload_param", false)) {
    z.context().warn(z.path_of("cpu_offload_param"),
                     "deprecated; read as offload_param.device \"cpu\"");
    if (c.zero.offload_param == zero::OffloadTarget::kNone) {
      c.zero.offload_param = zero::OffloadTarget::kCpu;
    }
  }
  if (z.boolean("cpu_offload_use_pin_memory", false)) {
    c.zero_extra.param_pin_memory = true;
    c.zero_extra.optimizer_pin_memory = true;
  }
}

void parse_zero(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> z = top.block("zero_optimization");
  if (!z) return;
  zero::ZeroConfig& zc = c.zero;
  zc.stage = static_cast<int>(z->integer("stage", 0, 0, 3));
  zc.contiguous_gradients = z->boolean("contiguous_gradients", true);
  zc.reduce_scatter = z->boolean("reduce_scatter", true);
  zc.reduce_bucket_size = auto_count(*z, "reduce_bucket_size", "", zc.reduce_bucket_size);
  c.zero_extra.allgather_partitions = z->boolean("allgather_partitions", true);
  c.zero_extra.allgather_bucket_size =
      z->count("allgather_bucket_size", c.zero_extra.allgather_bucket_size);
  // DeepSpeed's default: overlap at stage 3 only.
  zc.overlap_comm = z->boolean("overlap_comm", zc.stage == 3);
  zc.sub_group_size = z->count("sub_group_size", zc.sub_group_size);

  zc.prefetch_bucket_size = auto_count(*z, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                                       zc.prefetch_bucket_size);
  zc.param_persistence_threshold =
      auto_count(*z, "stage3_param_persistence_threshold", "param_persistence_threshold",
                 zc.param_persistence_threshold);
  zc.model_persistence_threshold =
      z->count(alias_key(*z, "stage3_model_persistence_threshold", "model_persistence_threshold"),
               zc.model_persistence_threshold);
  zc.max_live_parameters = z->count(
      alias_key(*z, "stage3_max_live_parameters", "max_live_parameters"), zc.max_live_parameters);
  zc.max_reuse_distance = z->count(alias_key(*z, "stage3_max_reuse_distance", "max_reuse_distance"),
                                   zc.max_reuse_distance);
  bool gather = false;
  for (std::string_view key :
       {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save"}) {
    gather = z->boolean(key, false) || gather;
  }
  c.checkpoint.gather_16bit_weights_on_model_save = gather;

  parse_offload_param(*z, c);
  parse_offload_optimizer(*z, c);
  parse_legacy_offload(*z, c);

  z->accept({"load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
             "use_multi_rank_bucket_allreduce", "memory_efficient_linear",
             "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings"});
  z->unsupported("round_robin_gradients", false, "");
  z->unsupported("zero_hpz_partition_size", 1, "");
  z->unsupported("zero_quantized_weights", false, "");
  z->unsupported("zero_quantized_nontrainable_weights", false, "");
  z->unsupported("zero_quantized_gradients", false, "");
  z->unsupported("zeropp_loco_param", Json(), "");
  z->unsupported("mics_shard_size", -1, "");
  z->unsupported("mics_hierarchical_params_gather", false, "");
  z->unsupported("legacy_stage1", false, "");
  z->unsupported("stage3_module_granularity_threshold", 0, "");
  z->unsupported("stage3_use_all_reduce_for_fetch_params", false, "");
  z->finish({"stage",
             "contiguous_gradients",
             "reduce_scatter",
             "reduce_bucket_size",
             "allgather_partitions",
             "allgather_bucket_size",
             "overlap_comm",
             "sub_group_size",
             "stage3_prefetch_bucket_size",
             "stage3_param_persistence_threshold",
             "stage3_model_persistence_threshold",
             "stage3_max_live_parameters",
             "stage3_max_reuse_distance",
             "stage3_gather_16bit_weights_on_model_save",
             "offload_param",
             "offload_optimizer",
             "round_robin_gradients",
             "zero_hpz_partition_size",
             "zero_quantized_weights",
             "zero_quantized_gradients"});
}

// ---- aio, monitoring, checkpoint ----------------------------------------------------------------

void parse_aio(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("aio");
  if (!b) return;
  aio::AioConfig& a = c.zero.aio;
  a.block_size = b->count("block_size", a.block_size);
  a.queue_depth = static_cast<int>(b->integer("queue_depth", a.queue_depth, 1, 4096));
  std::string_view threads = alias_key(*b, "intra_op_parallelism", "thread_count");
  a.intra_op_parallelism = static_cast<int>(b->integer(threads, a.intra_op_parallelism, 1, 256));
  a.single_submit = b->boolean("single_submit", a.single_submit);
  a.overlap_events = b->boolean("overlap_events", a.overlap_events);
  if (b->boolean("use_gds", false)) {
    top.context().fail(b->path_of("use_gds"),
                       "true is refused: zinf has no GPUDirect Storage path (NVMe traffic goes "
                       "through pinned host buffers); set it to false");
  }
  // `backend` is the key `zinf nvme-tune` writes into this block (DeepSpeed ignores keys it
  // does not know in "aio", so the file stays valid for it).
  if (b->has("backend")) {
    static const std::vector<std::string_view> kBackends = {"io_uring", "libaio", "psync"};
    a.backend = *aio::parse_backend(kBackends[b->choice("backend", kBackends, 0)]);
  }
  b->finish({"block_size", "queue_depth", "intra_op_parallelism", "thread_count", "single_submit",
             "overlap_events", "use_gds", "backend"});
  try {
    a.validate();
  } catch (const std::invalid_argument& e) {
    top.context().fail("aio", e.what());
  }
}

void parse_monitors(JsonBlock& top, RunConfig& c) {
  if (std::optional<JsonBlock> b = top.block("csv_monitor")) {
    c.csv_monitor.enabled = b->boolean("enabled", false);
    c.csv_monitor.output_path = b->string("output_path", c.csv_monitor.output_path);
    c.csv_monitor.job_name = b->string("job_name", c.csv_monitor.job_name);
    b->finish({"enabled", "output_path", "job_name"});
  }
  for (std::string_view key : {"tensorboard", "wandb", "comet"}) {
    std::optional<JsonBlock> b = top.block(key);
    if (b && b->boolean("enabled", false)) {
      top.context().warn(b->path_of("enabled"),
                         fmt::format("the {} monitor is not supported by zinf; use "
                                     "\"csv_monitor\" (same events, one CSV file each)",
                                     key));
    }
  }
}

void parse_checkpoint(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("checkpoint");
  if (!b) return;
  static const std::vector<std::string_view> kTags = {"Ignore", "Warn", "Fail"};
  c.checkpoint.tag_validation = kTags[b->choice("tag_validation", kTags, 1)];
  c.checkpoint.load_universal = b->boolean("load_universal", false);
  c.checkpoint.use_node_local_storage = b->boolean("use_node_local_storage", false);
  b->unsupported("parallel_write", Json(), "");
  b->finish({"tag_validation", "load_universal", "use_node_local_storage", "parallel_write"});
}

// DeepSpeed's activation_checkpointing block (deepspeed.checkpointing): zinf always
// checkpoints every decoder layer (a ZeroBlock keeps only its input and recomputes the layer in
// backward), so the block is read and type-checked. cpu_checkpointing moves those inputs to
// pinned CPU memory (zinf.activation_offload "cpu", which wins when both are given); each other
// switch zinf does not honour warns when it is on.
void parse_activation_checkpointing(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("activation_checkpointing");
  if (!b) return;
  const std::string recompute =
      "every decoder layer (ZeroBlock) keeps only its input and is recomputed in backward";
  auto warn_if_on = [&](std::string_view key, const std::string& why) {
    if (b->boolean(key, false)) {
      b->context().warn(b->path_of(key), fmt::format("true has no effect: {}; {}", why, recompute));
    }
  };
  warn_if_on("partition_activations",
             "zinf has no model parallelism to partition activations across");
  c.zinf.cpu_checkpointing = b->boolean("cpu_checkpointing", false);
  warn_if_on("contiguous_memory_optimization",
             "the saved layer inputs are LibTorch's tensors, not one buffer");
  warn_if_on("profile", "wall_clock_breakdown times the forward, backward and step");
  // No effect either way: the number of checkpoints is the number of layers, and the CPU
  // and CUDA paths order their own streams.
  (void)b->integer("number_checkpoints", 0, 0, std::numeric_limits<int32_t>::max());
  (void)b->boolean("synchronize_checkpoint_boundary", false);
  b->finish({"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
             "number_checkpoints", "synchronize_checkpoint_boundary", "profile"});
}

// DeepSpeed features zinf does not implement: a warning when they are switched on.
void parse_unsupported_features(JsonBlock& top, RunConfig& c) {
  for (std::string_view key :
       {"amp", "flops_profiler", "comms_logger", "elasticity", "autotuning", "eigenvalue",
        "progressive_layer_drop", "nebula", "hybrid_engine", "compile", "torch_autocast"}) {
    std::optional<JsonBlock> b = top.block(key);
    // The HF Trainer writes "amp": {"enabled": "auto"}; resolve_auto makes it false.
    if (b && key == "amp" && b->take_auto("enabled")) continue;
    if (b && b->boolean("enabled", false)) {
      top.context().warn(b->path_of("enabled"), "not supported by zinf; ignored");
    }
  }
  for (std::string_view key : {"sparse_attention", "pipeline", "compression_training",
                               "data_efficiency", "curriculum_learning", "quantize_training"}) {
    if (top.take(key) != nullptr) {
      top.context().warn(std::string(key), "not supported by zinf; ignored");
    }
  }
  parse_activation_checkpointing(top, c);
  top.accept({"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dump_state",
              "memory_breakdown", "dataloader_drop_last", "timers", "data_types",
              "seq_parallel_communication_data_type", "use_data_before_expert_parallelism",
              "graph_harvesting", "disable_allgather"});
  top.unsupported("sparse_gradients", false, "");
}

// ---- zinf ---------------------------------------------------------------------------------------

void parse_zinf(JsonBlock& top, RunConfig& c) {
  std::optional<JsonBlock> b = top.block("zinf");
  if (!b) return;
  ZinfConfig& z = c.zinf;
  if (std::optional<JsonBlock> a = b->block("accelerator")) {
    static const std::vector<std::string_view> kTypes = {"auto", "cpu", "cuda", "strict"};
    z.accelerator = static_cast<AcceleratorType>(a->choice("type", kTypes, 0));
    z.memory_budget_bytes = a->bytes("memory_budget");
    if (z.memory_budget_bytes && *z.memory_budget_bytes == 0) {
      b->context().fail(a->path_of("memory_budget"), "must be more than 0 bytes");
    }
    a->finish({"type", "memory_budget"});
  }
  z.comm_timeout_s = b->number("comm_timeout_s", z.comm_timeout_s, 1e-3, 1e9);
  z.io_timeout_s = b->number("io_timeout_s", z.io_timeout_s, 1e-3, 1e9);
  if (const Json* paths = b->take("nvme_paths")) {
    bool ok = paths->is_array() && !paths->empty();
    for (const Json& p : ok ? *paths : Json::array()) {
      ok = ok && p.is_string() && !p.get_ref<const std::string&>().empty();
    }
    if (!ok) {
      b->context().fail(b->path_of("nvme_paths"),
                        fmt::format("expected a non-empty list of folder paths such as "
                                    "[\"/mnt/nvme0\", \"/mnt/nvme1\"], got {}",
                                    detail::describe(*paths)));
    }
    z.nvme_paths = paths->get<std::vector<std::string>>();
  }
  z.swap_checksums = b->boolean("swap_checksums", z.swap_checksums);
  z.pinned_memory_limit_bytes = b->bytes("pinned_memory_limit");
  z.threads = static_cast<int>(b->integer("threads", 0, 0, 4096));
  static const std::vector<std::string_view> kBackends = {"auto", "single", "gloo", "nccl"};
  z.comm_backend = kBackends[b->choice("comm_backend", kBackends, 0)];
  if (b->has("activation_offload")) {
    static const std::vector<std::string_view> kTiers = {"none", "cpu", "nvme"};
    z.activation_offload =
        static_cast<zero::OffloadTarget>(b->choice("activation_offload", kTiers, 0));
  }
  if (b->has("overlap_optimizer")) {
    z.overlap_optimizer = b->boolean("overlap_optimizer", false);
  }
  if (b->has("grad_offload")) {
    static const std::vector<std::string_view> kGradTiers = {"cpu", "nvme"};
    z.grad_offload = b->choice("grad_offload", kGradTiers, 0) == 0 ? zero::OffloadTarget::kCpu
                                                                   : zero::OffloadTarget::kNvme;
  }
  b->finish({"accelerator", "comm_timeout_s", "io_timeout_s", "nvme_paths", "swap_checksums",
             "pinned_memory_limit", "threads", "comm_backend", "activation_offload",
             "overlap_optimizer", "grad_offload"});

  c.zero.swap_checksums = z.swap_checksums;
  c.zero.pinned_memory_limit = z.pinned_memory_limit_bytes;
  c.zero.aio.io_timeout_s = z.io_timeout_s;  // parse_aio ran first: the aio block has no such key
  c.zero.comm_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(z.comm_timeout_s * 1000.0 + 0.5));
}

// ---- rules across blocks ------------------------------------------------------------------------

std::string_view device_name(zero::OffloadTarget t) {
  return t == zero::OffloadTarget::kNvme ? "nvme" : t == zero::OffloadTarget::kCpu ? "cpu" : "none";
}

void check_offload(ParseContext& ctx, RunConfig& c) {
  const zero::ZeroConfig& z = c.zero;
  if (z.offload_param != zero::OffloadTarget::kNone && z.stage != 3) {
    ctx.fail("zero_optimization.offload_param",
             fmt::format("offloading parameters (device \"{}\") needs stage 3; "
                         "zero_optimization.stage is {}",
                         device_name(z.offload_param), z.stage));
  }
  if (z.offload_optimizer != zero::OffloadTarget::kNone && z.stage == 0) {
    ctx.fail("zero_optimization.offload_optimizer",
             fmt::format("offloading the optimizer (device \"{}\") needs stage 1, 2 or 3; "
                         "zero_optimization.stage is 0",
                         device_name(z.offload_optimizer)));
  }
  if (z.offload_optimizer == zero::OffloadTarget::kNvme && z.stage != 3) {
    ctx.fail("zero_optimization.offload_optimizer.device",
             fmt::format("\"nvme\" needs stage 3 (zero_optimization.stage is {}); use \"cpu\" "
                         "at stages 1 and 2",
                         z.stage));
  }
  if (c.zero_extra.offload_ratio < 1.0 && z.stage != 3) {
    ctx.fail("zero_optimization.offload_optimizer.ratio",
             fmt::format("{} (partial offload) needs stage 3; zero_optimization.stage is {}",
                         c.zero_extra.offload_ratio, z.stage));
  }
  if (z.offload_optimizer != zero::OffloadTarget::kNone &&
      z.optimizer_buffer_count < static_cast<size_t>(c.optimizer.states_per_param())) {
    const optimizer_cpu::StateArrays states = optimizer_cpu::state_arrays(c.optimizer.type);
    std::string names = "fp32 params, grads";
    if (states.exp_avg) names += fmt::format(", {}", states.exp_avg_name);
    if (states.exp_avg_sq) names += fmt::format(", {}", states.exp_avg_sq_name);
    ctx.fail("zero_optimization.offload_optimizer.buffer_count",
             fmt::format("{} buffers cannot hold the {} states per parameter of {} ({}); set it "
                         "to at least {}",
                         z.optimizer_buffer_count, c.optimizer.states_per_param(),
                         to_string(c.optimizer.type), names, c.optimizer.states_per_param()));
  }
  if (z.sub_group_size == 0) {
    ctx.fail("zero_optimization.sub_group_size",
             "0 elements per sub-group: the optimizer updates at least one element at a time");
  }
  if (z.offload_param == zero::OffloadTarget::kNvme) {
    if (z.param_buffer_count == 0) {
      ctx.fail("zero_optimization.offload_param.buffer_count",
               "0 buffers: parameters on nvme are read through at least one pinned buffer");
    }
    if (z.param_buffer_size == 0) {
      ctx.fail("zero_optimization.offload_param.buffer_size", "0 elements per buffer");
    }
  }

  // Swap folders: zinf.nvme_paths when given, else each nvme tier's own nvme_path; each
  // with the key it came from.
  std::vector<std::string>& paths = c.zero.nvme_paths;
  std::vector<std::string>& keys = c.nvme_path_keys;
  paths = c.zinf.nvme_paths;
  for (size_t i = 0; i < paths.size(); ++i) keys.push_back(fmt::format("zinf.nvme_paths[{}]", i));
  auto add = [&](const std::string& path, const std::string& key) {
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      paths.push_back(path);
      keys.push_back(key);
    }
  };
  auto add_tier = [&](zero::OffloadTarget device, const std::string& path, const char* block) {
    if (device != zero::OffloadTarget::kNvme || !c.zinf.nvme_paths.empty()) return;
    const std::string key = fmt::format("zero_optimization.{}.nvme_path", block);
    if (path.empty()) {
      ctx.fail(key,
               fmt::format("missing: zero_optimization.{}.device is \"nvme\"; set nvme_path to "
                           "a folder on the NVMe drive (or list folders in zinf.nvme_paths)",
                           block));
    }
    add(path, key);
  };
  add_tier(z.offload_param, c.zero_extra.param_nvme_path, "offload_param");
  add_tier(z.offload_optimizer, c.zero_extra.optimizer_nvme_path, "offload_optimizer");
  // Activation offload: zinf.activation_offload, else DeepSpeed's cpu_checkpointing. On NVMe
  // the saved inputs go to zinf.nvme_paths, else to the parameters' folder, else the
  // optimizer's.
  const zero::OffloadTarget from_deepspeed =
      c.zinf.cpu_checkpointing ? zero::OffloadTarget::kCpu : zero::OffloadTarget::kNone;
  c.zero.activation_offload = c.zinf.activation_offload.value_or(from_deepspeed);
  // The optimizer's overlap with the backward: on by default where its I/O is to hide.
  c.zero.overlap_optimizer =
      c.zinf.overlap_optimizer.value_or(z.offload_optimizer == zero::OffloadTarget::kNvme);
  c.zero.overlap_optimizer_given = c.zinf.overlap_optimizer.has_value();
  // Where the optimizer's grads accumulate: a choice only when the optimizer is on NVMe (on
  // the CPU tier they are in host memory already; with none, on the device).
  if (c.zinf.grad_offload && z.offload_optimizer != zero::OffloadTarget::kNvme &&
      !(z.offload_optimizer == zero::OffloadTarget::kCpu &&
        *c.zinf.grad_offload == zero::OffloadTarget::kCpu)) {
    ctx.fail("zinf.grad_offload",
             fmt::format("\"{}\" needs zero_optimization.offload_optimizer.device \"nvme\" (it "
                         "is \"{}\"): the grads accumulate where the optimizer's states are "
                         "otherwise",
                         device_name(*c.zinf.grad_offload), device_name(z.offload_optimizer)));
  }
  c.zero.host_grads =
      z.offload_optimizer == zero::OffloadTarget::kNvme &&
      c.zinf.grad_offload.value_or(zero::OffloadTarget::kCpu) == zero::OffloadTarget::kCpu;
  c.zero.host_grads_given = c.zinf.grad_offload.has_value();
  if (c.zinf.activation_offload && c.zinf.cpu_checkpointing &&
      *c.zinf.activation_offload != zero::OffloadTarget::kCpu) {
    ctx.warn("activation_checkpointing.cpu_checkpointing",
             fmt::format("zinf.activation_offload \"{}\" decides where the saved layer inputs go",
                         device_name(*c.zinf.activation_offload)));
  }
  if (c.zero.activation_offload == zero::OffloadTarget::kNvme && c.zinf.nvme_paths.empty()) {
    const bool params = !c.zero_extra.param_nvme_path.empty();
    const std::string& folder =
        params ? c.zero_extra.param_nvme_path : c.zero_extra.optimizer_nvme_path;
    if (folder.empty()) {
      ctx.fail("zinf.activation_offload",
               "\"nvme\" needs a swap folder: set zero_optimization.offload_param.nvme_path "
               "(or offload_optimizer.nvme_path, or zinf.nvme_paths)");
    }
    c.zero.activation_nvme_path = folder;
    add(folder, params ? "zero_optimization.offload_param.nvme_path"
                       : "zero_optimization.offload_optimizer.nvme_path");
  }
  // Without zinf.nvme_paths each tier keeps to its own folder (DeepSpeed's meaning).
  if (c.zinf.nvme_paths.empty()) {
    if (z.offload_param == zero::OffloadTarget::kNvme) {
      c.zero.param_nvme_path = c.zero_extra.param_nvme_path;
    }
    if (z.offload_optimizer == zero::OffloadTarget::kNvme) {
      c.zero.optimizer_nvme_path = c.zero_extra.optimizer_nvme_path;
    }
  }
}

}  // namespace

void detail::apply_precision(RunConfig& c) {
  if (c.precision.fp16_enabled && c.precision.bf16_enabled) {
    throw ConfigError(c.source, "bf16.enabled",
                      "fp16.enabled and bf16.enabled are both true; enable one of them");
  }
  c.zero.precision = c.precision.fp16_enabled   ? zero::Precision::kFloat16
                     : c.precision.bf16_enabled ? zero::Precision::kBFloat16
                                                : zero::Precision::kFloat32;
}

RunConfig parse_config_json(const nlohmann::json& root, const std::string& source,
                            const ParseOverrides& overrides) {
  ParseContext ctx;
  ctx.source = source;
  if (!root.is_object()) {
    ctx.fail("", fmt::format("the top level must be a JSON object ({{...}}), got {}",
                             detail::describe(root)));
  }
  RunConfig c;
  c.source = source;
  JsonBlock top(root, "", ctx);
  parse_batch(top, c);
  parse_top_scalars(top, c);
  parse_optimizer(top, c);
  parse_scheduler(top, c);
  parse_fp16(top, c);
  parse_bf16(top, c);
  c.zero.overlap_comm = false;  // DeepSpeed's default below stage 3 (parse_zero may change it)
  parse_zero(top, c);
  parse_aio(top, c);
  parse_monitors(top, c);
  parse_checkpoint(top, c);
  parse_zinf(top, c);
  if (!overrides.nvme_paths.empty()) c.zinf.nvme_paths = overrides.nvme_paths;
  parse_unsupported_features(top, c);
  top.finish({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "optimizer", "scheduler", "fp16", "bf16", "gradient_clipping", "steps_per_print",
              "wall_clock_breakdown", "zero_optimization", "aio", "csv_monitor", "checkpoint",
              "zinf", "communication_data_type", "prescale_gradients"});
  check_offload(ctx, c);
  detail::apply_precision(c);
  c.auto_keys = std::move(ctx.auto_keys);
  c.warnings = std::move(ctx.warnings);
  return c;
}

RunConfig parse_config_string(std::string_view text, const std::string& source) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() carries the line and column ("parse error at line 3, column 5: ...").
    throw ConfigError(source, "", fmt::format("not valid JSON: {}", e.what()));
  }
  return parse_config_json(root, source);
}

RunConfig parse_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(path, "",
                      fmt::format("cannot open the config file: {}", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw ConfigError(path, "",
                      fmt::format("cannot read the config file: {}", std::strerror(errno)));
  }
  return parse_config_string(text.str(), path);
}

}  // namespace zinf::config
