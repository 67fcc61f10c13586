#include "tools/train_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/config/lr_schedule.h"
#include "engine/config/resolve.h"
#include "engine/cuda_compute.h"
#include "offload/cuda_accelerator.h"
#include "tools/train.h"

namespace zinf::tools {
namespace {

using config::RunConfig;

// A command-line value replaces the file's: an "auto" goes to resolve_auto through the
// context (so its line says "auto: from the command line"), a written value is replaced
// here and listed. Returns true when a written value changed.
bool override_count(const RunConfig& c, const std::optional<int64_t>& value, const char* key,
                    const char* flag, std::optional<int64_t>& field,
                    std::optional<int64_t>& context_field, std::vector<std::string>& lines) {
  if (!value) return false;
  if (*value < 1) throw std::invalid_argument(fmt::format("{} {} must be >= 1", flag, *value));
  context_field = value;
  if (c.is_auto(key)) return false;
  const bool changed = field != value;
  field = value;
  lines.push_back(fmt::format("{} = {} ({})", key, *value, flag));
  return changed;
}

void apply_batch_overrides(RunConfig& c, const ConfigOverrides& o, config::AutoContext& ctx,
                           std::vector<std::string>& lines) {
  config::BatchConfig& b = c.batch;
  const bool file_fixes_all =
      b.train_batch_size && b.micro_batch_per_gpu && b.gradient_accumulation_steps;
  const bool micro_changed =
      override_count(c, o.micro_batch, "train_micro_batch_size_per_gpu", "--micro-batch",
                     b.micro_batch_per_gpu, ctx.micro_batch_per_gpu, lines);
  const bool accum_changed =
      override_count(c, o.grad_accum, "gradient_accumulation_steps", "--grad-accum",
                     b.gradient_accumulation_steps, ctx.gradient_accumulation_steps, lines);
  const bool changed = micro_changed || accum_changed;
  // With only one of micro / accumulation overridden and train_batch_size fixed, DeepSpeed's
  // rules derive the other; with all three fixed the override decides the global batch.
  if (changed && b.train_batch_size && !c.is_auto("train_batch_size")) {
    const bool both = b.micro_batch_per_gpu && b.gradient_accumulation_steps;
    if (file_fixes_all || (both && o.micro_batch && o.grad_accum)) {
      b.train_batch_size.reset();
      lines.push_back("train_batch_size: recomputed from the overrides");
    } else if (o.micro_batch && !o.grad_accum) {
      b.gradient_accumulation_steps.reset();
    } else if (o.grad_accum && !o.micro_batch) {
      b.micro_batch_per_gpu.reset();
    }
  }
}

void apply_lr_override(RunConfig& c, const ConfigOverrides& o, config::AutoContext& ctx,
                       std::vector<std::string>& lines) {
  if (!o.lr) return;
  if (!(*o.lr > 0.0)) throw std::invalid_argument(fmt::format("--lr {} must be > 0", *o.lr));
  ctx.lr = o.lr;
  if (!c.is_auto("optimizer.params.lr")) {
    c.optimizer.lr = *o.lr;
    lines.push_back(fmt::format("optimizer.params.lr = {} (--lr)", *o.lr));
  }
  // WarmupLR / WarmupDecayLR climb to warmup_max_lr, not to the optimizer's lr: the peak the
  // user asked for is that one.
  const config::SchedulerType t = c.scheduler.type;
  if ((t == config::SchedulerType::kWarmupLR || t == config::SchedulerType::kWarmupDecayLR) &&
      !c.is_auto("scheduler.params.warmup_max_lr")) {
    c.scheduler.warmup_max_lr = *o.lr;
    lines.push_back(fmt::format("scheduler.params.warmup_max_lr = {} (--lr)", *o.lr));
  }
}

}  // namespace

nlohmann::json load_config_json(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw config::ConfigError(path, "",
                              "is a folder, not a config file: give the JSON file (such as "
                              "ds_config.json) itself");
  }
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in) {
    (void)config::parse_config(path);  // throws the parser's message (path, errno text)
    throw config::ConfigError(path, "", "cannot be read");
  }
  nlohmann::json root = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    (void)config::parse_config(path);  // throws with the line and column
    throw config::ConfigError(path, "", "not valid JSON");
  }
  return root;
}

nlohmann::json bare_config(const engine::LlamaConfig& model, int64_t steps, int world_size) {
  uint64_t largest = 0, layer_numel = 0;
  for (const auto& p : engine::llama_parameter_shapes(model)) {
    if (p.in_block) largest = std::max(largest, static_cast<uint64_t>(p.numel));  // swapped
    if (p.name.rfind("model.layers.0.", 0) == 0) layer_numel += static_cast<uint64_t>(p.numel);
  }
  const uint64_t states = static_cast<uint64_t>(model.parameter_count()) * kStateBytesPerParam;
  nlohmann::json root =
      nlohmann::json::parse(default_train_config(states / 4, largest, layer_numel, steps));
  // Several ranks: one sample per micro-batch (the activations and the gradient buckets of
  // 2 samples would not fit the budget) and the 16-sample global batch of one rank kept.
  if (world_size > 1) {
    root["train_micro_batch_size_per_gpu"] = 1;
    root["gradient_accumulation_steps"] = std::max(1, 16 / world_size);
  }
  return root;
}

std::vector<uint64_t> llama_swapped_param_numels(const engine::LlamaConfig& model) {
  std::vector<uint64_t> numels;
  for (const auto& p : engine::llama_parameter_shapes(model)) {
    if (p.in_block) numels.push_back(static_cast<uint64_t>(p.numel));
  }
  return numels;
}

RunConfig resolve_run_config(const nlohmann::json& root, const std::string& source,
                             const ConfigOverrides& overrides, const engine::LlamaConfig& model,
                             std::vector<std::string>* override_lines) {
  std::vector<std::string> lines;
  config::ParseOverrides parse;
  if (!overrides.nvme_path.empty()) {
    parse.nvme_paths = {overrides.nvme_path};
    lines.push_back(fmt::format("zinf.nvme_paths = [\"{}\"] (--nvme-path)", overrides.nvme_path));
  }
  RunConfig c = config::parse_config_json(root, source, parse);
  if (overrides.memory_budget) {
    if (*overrides.memory_budget == 0) {
      throw std::invalid_argument("--memory-budget must be more than 0 bytes");
    }
    c.zinf.memory_budget_bytes = overrides.memory_budget;
    lines.push_back(fmt::format("zinf.accelerator.memory_budget = {} (--memory-budget)",
                                engine::format_bytes(*overrides.memory_budget)));
  }

  config::AutoContext ctx;
  ctx.world_size = overrides.world_size;
  ctx.total_steps = overrides.steps;
  ctx.hidden_size = model.hidden_size;
  ctx.param_numels = llama_swapped_param_numels(model);
  ctx.cuda_unavailable_reason = engine::cuda_compute_unavailable_reason();
  ctx.cuda_available = ctx.cuda_unavailable_reason.empty();
  ctx.check_paths = overrides.check_paths;
  ctx.default_micro_batch_per_gpu = kDefaultMicroBatch;
  ctx.default_gradient_accumulation_steps = kDefaultGradAccum;
  apply_batch_overrides(c, overrides, ctx, lines);
  apply_lr_override(c, overrides, ctx, lines);
  config::resolve_auto(c, ctx);
  if (c.zinf.accelerator == config::AcceleratorType::kCuda && !ctx.cuda_available) {
    throw config::ConfigError(source, "zinf.accelerator.type",
                              "\"cuda\" cannot be used: " + ctx.cuda_unavailable_reason +
                                  " (\"auto\" picks the CPU then; \"strict\" checks the GPU "
                                  "path without one)");
  }
  if (override_lines != nullptr) *override_lines = std::move(lines);
  return c;
}

engine::PlanInputs llama_plan_inputs(const engine::LlamaConfig& model,
                                     const config::RunConfig& config, int world_size,
                                     int64_t micro_batch, int64_t seq_len) {
  engine::PlanInputs in;
  for (const auto& s : engine::llama_parameter_shapes(model)) {
    in.params.push_back({static_cast<uint64_t>(s.numel), true, s.in_block, !s.in_block, s.tied});
  }
  in.zero = config.zero;
  in.world_size = world_size;
  in.optimizer_states = optimizer_cpu::state_arrays(config.optimizer.type);
  const int64_t element_bytes = config.zero.precision == zero::Precision::kFloat32 ? 4 : 2;
  in.activations = engine::llama_activations(model, micro_batch, seq_len, element_bytes);
  in.host_reads_device_memory = config.zinf.accelerator == config::AcceleratorType::kCpu;
  return in;
}

at::ScalarType parameter_dtype(zero::Precision precision) {
  switch (precision) {
    case zero::Precision::kBFloat16:
      return at::kBFloat16;
    case zero::Precision::kFloat16:
      return at::kHalf;
    case zero::Precision::kFloat32:
      break;
  }
  return at::kFloat;
}

const char* precision_name(zero::Precision precision) {
  switch (precision) {
    case zero::Precision::kBFloat16:
      return "bf16";
    case zero::Precision::kFloat16:
      return "fp16";
    case zero::Precision::kFloat32:
      break;
  }
  return "fp32";
}

engine::EngineOptions engine_options(const RunConfig& c, const zero::LaunchEnv& launch,
                                     int64_t tokens_per_sample, int threads) {
  engine::EngineOptions e;
  e.zero = c.zero;

  const config::OptimizerConfig& o = c.optimizer;
  e.optimizer.type = o.type;
  e.optimizer.lr = o.lr;
  e.optimizer.beta1 = o.beta1;
  e.optimizer.beta2 = o.beta2;
  e.optimizer.eps = o.eps;
  e.optimizer.weight_decay = o.weight_decay;
  e.optimizer.bias_correction = o.bias_correction;
  e.optimizer.adam_w_mode = o.adam_w_mode;
  if (c.scheduler.type != config::SchedulerType::kNone) {
    e.lr_schedule = config::make_lr_schedule(c.scheduler, o.lr, c.source);
  }
  const config::MomentumSchedule momentum = config::make_momentum_schedule(c.scheduler, o.type);
  if (momentum.beta1) {
    e.beta1_schedule = momentum.beta1;
    e.optimizer.beta2 = momentum.beta2;  // OneCycle's cycle_momentum fixes beta2 (DeepSpeed)
  }

  e.micro_batch_size = c.batch.micro_batch_per_gpu.value_or(1);
  e.tokens_per_sample = tokens_per_sample;
  e.steps_per_print = c.steps_per_print;
  e.wall_clock_breakdown = c.wall_clock_breakdown;
  e.gather_16bit_weights_on_model_save = c.checkpoint.gather_16bit_weights_on_model_save;

  e.accelerator = std::string(config::to_string(c.zinf.accelerator));
  if (c.zinf.memory_budget_bytes) e.memory_budget = *c.zinf.memory_budget_bytes;
  e.comm.backend = c.zinf.comm_backend;
  e.comm.timeout = c.zero.comm_timeout;
  e.launch = launch;
  e.threads = threads;
  return e;
}

}  // namespace zinf::tools
