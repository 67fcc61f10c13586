#include "tools/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "engine/memory_plan.h"
#include "engine/model/hf_checkpoint.h"
#include "tools/train.h"
#include "tools/train_config.h"

namespace zinf::tools {
namespace {

using engine::format_bytes;

// "7e9", "1.3B", "350M", "125m" (a named size first), "20000000".
double parse_count(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument(
        fmt::format("--model-size \"{}\" is neither a named size ({}) nor a parameter count", text,
                    engine::named_llama_list()));
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit == "K")
    value *= 1e3;
  else if (unit == "M")
    value *= 1e6;
  else if (unit == "B" || unit == "G")
    value *= 1e9;
  else if (unit == "T")
    value *= 1e12;
  else if (!unit.empty()) {
    throw std::invalid_argument(
        fmt::format("--model-size \"{}\": unknown unit \"{}\" (K, M, B or T)", text, unit));
  }
  if (!(value >= 1e5) || value > 1e14) {
    throw std::invalid_argument(fmt::format(
        "--model-size \"{}\": a parameter count between 1e5 and 1e14 is expected", text));
  }
  return value;
}

uint64_t largest_layer(const engine::LlamaConfig& c) {
  // DeepSpeed counts one module's own parameters: the largest is the embedding, the head or
  // an MLP projection.
  const int64_t h = c.hidden_size;
  return static_cast<uint64_t>(std::max({c.vocab_size * h, h * c.intermediate_size}));
}

const char* target_name(zero::OffloadTarget target) {
  switch (target) {
    case zero::OffloadTarget::kCpu:
      return "cpu";
    case zero::OffloadTarget::kNvme:
      return "nvme";
    case zero::OffloadTarget::kNone:
      break;
  }
  return "none";
}

}  // namespace

engine::LlamaConfig llama_for_size(const std::string& size, int64_t vocab_size) {
  if (auto named = engine::named_llama(size, vocab_size)) return *named;
  const double target = parse_count(size);
  // The named shape whose count is nearest, then as many layers as the count asks for.
  engine::LlamaConfig best;
  double best_gap = INFINITY;
  for (const char* name : {"tiny", "small", "125m", "350m", "1b", "3b", "7b", "13b"}) {
    const auto c = *engine::named_llama(name, vocab_size);
    const double gap = std::abs(std::log(static_cast<double>(c.parameter_count()) / target));
    if (gap < best_gap) best_gap = gap, best = c;
  }
  const int64_t h = best.hidden_size;
  const double per_layer = static_cast<double>(4 * h * h + 3 * h * best.intermediate_size + 2 * h);
  const double fixed = static_cast<double>(2 * best.vocab_size * h + h);
  best.num_layers = std::max<int64_t>(1, std::llround((target - fixed) / per_layer));
  best.name = fmt::format("custom ({} layers of hidden {})", best.num_layers, h);
  return best;
}

int run_estimate(const EstimateArgs& args) {
  try {
    if (args.gpus_per_node < 1 || args.nodes < 1) {
      throw std::invalid_argument("--num-gpus and --num-nodes must be >= 1");
    }
    if (args.vocab_size < 1 || args.seq_len < 1) {
      throw std::invalid_argument("--vocab and --seq-len must be >= 1");
    }
    // The exact model a Hugging Face folder's config.json describes (--vocab is its), or a
    // named size / parameter count.
    const engine::LlamaConfig model =
        args.init_from.empty()
            ? llama_for_size(args.model_size, args.vocab_size)
            : engine::read_hf_llama_config(args.init_from + "/config.json", nullptr);
    const int world = args.gpus_per_node * args.nodes;

    // The config as `zinf train` would resolve it for this model and world size (swap
    // folders are not probed: they belong to the machine that will train).
    nlohmann::json root =
        args.config.empty() ? bare_config(model, 1000, world) : load_config_json(args.config);
    ConfigOverrides overrides;
    overrides.world_size = world;
    overrides.check_paths = false;
    overrides.steps = 1000;  // only a scheduler's "auto" total_num_steps reads it
    overrides.micro_batch = args.micro_batch;
    const auto given = [&](const char* key) {
      return root.is_object() && root.contains(key) && !root[key].is_string();
    };
    if (!overrides.micro_batch && !given("train_micro_batch_size_per_gpu") &&
        !given("train_batch_size")) {
      overrides.micro_batch = 1;
    }
    if (args.config.empty()) overrides.nvme_path = "<nvme_path>";
    const std::string source = args.config.empty() ? "embedded default" : args.config;
    const config::RunConfig cfg = resolve_run_config(root, source, overrides, model, nullptr);
    for (const auto& w : cfg.warnings) fmt::print("warning: {}\n", w);
    const int64_t micro = cfg.batch.micro_batch_per_gpu.value_or(1);
    const engine::PlanInputs in = llama_plan_inputs(model, cfg, world, micro, args.seq_len);
    const uint64_t params = static_cast<uint64_t>(model.parameter_count());
    fmt::print("model {}: {:.3f} B parameters ({} layers, hidden {}, intermediate {}, vocab {})\n",
               model.name, static_cast<double>(params) / 1e9, model.num_layers, model.hidden_size,
               model.intermediate_size, model.vocab_size);
    if (const std::string notes = engine::architecture_notes(model);
        !notes.empty() || !args.init_from.empty()) {
      fmt::print("  architecture: {}; {} heads ({} key/value), head_dim {}\n",
                 notes.empty() ? model.model_type : notes, model.num_heads, model.kv_heads(),
                 model.head_size());
    }
    fmt::print("config {}: stage {}, {}, offload_param {}, offload_optimizer {}, {} rank(s)\n\n",
               source, in.zero.stage, precision_name(in.zero.precision),
               target_name(in.zero.offload_param), target_name(in.zero.offload_optimizer), world);
    const engine::MemoryPlan plan = engine::plan_memory(in);
    fmt::print(
        "Memory plan per rank (what `zinf train` would allocate; micro-batch {} x {} "
        "tokens):\n{}\n",
        micro, args.seq_len, plan.table());

    // zinf's plan for each offload choice at stage 3.
    fmt::print(
        "Model states per offload choice, zinf's plan at stage 3 without activations ({} "
        "node(s) x {} GPU(s); nvme rows with max_in_cpu 0):\n",
        args.nodes, args.gpus_per_node);
    fmt::print("  {:<14} {:<18} {:>14} {:>14} {:>14}\n", "offload_param", "offload_optimizer",
               "per GPU", "per CPU (node)", "NVMe (node)");
    using zero::OffloadTarget;
    const OffloadTarget targets[] = {OffloadTarget::kNone, OffloadTarget::kCpu,
                                     OffloadTarget::kNvme};
    for (const OffloadTarget param : targets) {
      for (const OffloadTarget opt : targets) {
        if (param != OffloadTarget::kNone && opt == OffloadTarget::kNone) continue;
        engine::PlanInputs v = in;
        v.zero.stage = 3;
        v.zero.offload_param = param;
        v.zero.offload_optimizer = opt;
        v.activations = {};
        // "nvme" means on NVMe: no parameter slice kept in memory (max_in_cpu 0).
        if (param == OffloadTarget::kNvme) v.zero.param_max_in_cpu = 0;
        const engine::MemoryPlan p = engine::plan_memory(v);
        const uint64_t host = (p.pinned + p.host) * static_cast<uint64_t>(args.gpus_per_node);
        fmt::print("  {:<14} {:<18} {:>14} {:>14} {:>14}\n", target_name(param), target_name(opt),
                   format_bytes(p.device_total()), format_bytes(host),
                   format_bytes(p.nvme * static_cast<uint64_t>(args.gpus_per_node)));
      }
    }
    fmt::print(
        "\nDeepSpeed's estimate_zero3_model_states_mem_needs_all_live formula for the same "
        "model (largest layer {:.1f} M params):\n",
        static_cast<double>(largest_layer(model)) / 1e6);
    fmt::print("  {:>9} {:>9} {:<36} {}\n", "per CPU", "per GPU", "options", "");
    for (const auto& r :
         deepspeed_zero3_estimates(params, largest_layer(model), args.gpus_per_node, args.nodes)) {
      fmt::print("  {:>9} {:>9} offload_param={}, offload_optimizer={}, zero_init={}\n",
                 fmt::format("{:.2f}GB", static_cast<double>(r.per_cpu) / (1ull << 30)),
                 fmt::format("{:.2f}GB", static_cast<double>(r.per_gpu) / (1ull << 30)),
                 r.offload_param, r.offload_optimizer, r.zero_init ? 1 : 0);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zinf estimate: {}\n", e.what());
    return 2;
  }
}

}  // namespace zinf::tools
