// The pickle dicts of a checkpoint in DeepSpeed's layout (deepspeed_layout.h), written and
// read back.

#include "engine/checkpoint/deepspeed_layout.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <type_traits>
#include <variant>

namespace zinf::engine::checkpoint {
namespace {

namespace ser = zinf::serialization;
using ser::PickleValue;

const std::set<std::string>& reserved_keys() {
  static const std::set<std::string> keys = {"module",
                                             "buffer_names",
                                             "param_shapes",
                                             "frozen_param_shapes",
                                             "frozen_param_fragments",
                                             "shared_params",
                                             "optimizer",
                                             "lr_scheduler",
                                             "data_sampler",
                                             "random_ltd",
                                             "sparse_tensor_module_names",
                                             "skipped_steps",
                                             "global_steps",
                                             "global_samples",
                                             "dp_world_size",
                                             "mp_world_size",
                                             "ds_config",
                                             "ds_version",
                                             "zinf"};
  return keys;
}

// DeepSpeed's loss scaler object (deepspeed.runtime.fp16.loss_scaler's LossScaler, or
// DynamicLossScaler when dynamic) with its attributes as BUILD's state, as DeepSpeed pickles
// it: DeepSpeed's load_checkpoint puts what it finds here in place of its scaler and calls
// its methods (a plain dict broke its next backward: "'dict' object has no attribute
// 'scale_loss'"). The iteration, last overflow and hysteresis left are written for a
// static scale too (zinf reads them back; Python keeps extra attributes).
PickleValue* loss_scaler_object(FileBuilder& b, const zero::LossScaler& scaler) {
  const zero::LossScaler::State s = scaler.state();
  const bool dynamic = scaler.dynamic();
  PickleValue* d = b.dict();
  b.put(d, "cur_scale", b.real(s.scale));
  b.put(d, "dynamic", b.boolean(dynamic));
  b.put(d, "cur_iter", b.integer(s.iteration));
  b.put(d, "last_overflow_iter", b.integer(s.last_overflow_iteration));
  b.put(d, "cur_hysteresis", b.integer(s.hysteresis_left));
  if (dynamic) {
    b.put(d, "scale_factor", b.real(2.0));
    b.put(d, "scale_window", b.integer(scaler.window()));
    b.put(d, "min_scale", b.real(scaler.min_scale()));
    b.put(d, "delayed_shift", b.integer(scaler.hysteresis()));
    b.put(d, "consecutive_hysteresis", b.boolean(scaler.consecutive_hysteresis()));
    b.put(d, "raise_error_at_min_scale", b.boolean(true));
    b.put(d, "dtype", b.doc().global("torch", "float16"));
  }
  PickleValue* object =
      b.doc().object("deepspeed.runtime.fp16.loss_scaler",
                     dynamic ? "DynamicLossScaler" : "LossScaler", b.doc().tuple({}), true);
  b.doc().set_state(object, d);
  return object;
}

// torch's optimizer state dict of the partition: state[u] holds unit u's step and states,
// one param group lists the units. Streamed tensors: the params of every unit first, then
// unit by unit its states (partition_keys() relies on this order).
PickleValue* torch_optimizer_state(FileBuilder& b, const SavedRun& run, PickleValue* flat,
                                   PartitionKeys& keys) {
  const std::vector<Unit>& units = run.view.units;
  const std::vector<StateName>& states = run.view.states;
  const OptimizerSettings& o = run.options.optimizer;
  for (size_t u = 0; u < units.size(); ++u) {
    b.doc().append(flat, b.streamed(units[u].numel, units[u].valid, &keys[0][u]));
  }
  PickleValue* torch_state = b.dict();
  PickleValue* st = b.dict();
  for (size_t u = 0; u < units.size(); ++u) {
    PickleValue* entry = b.dict();
    b.put(entry, "step", b.integer(run.applied_steps));
    for (size_t a = 0; a < states.size(); ++a) {
      b.put(entry, states[a].name, b.streamed(units[u].numel, units[u].valid, &keys[1 + a][u]));
    }
    b.doc().set_item(st, b.integer(static_cast<int64_t>(u)), entry);
  }
  b.put(torch_state, "state", st);
  PickleValue* groups = b.list();
  PickleValue* group = b.dict();
  b.put(group, "lr", b.real(run.lr));
  b.put(group, "betas", b.doc().tuple({b.real(o.beta1), b.real(o.beta2)}));
  b.put(group, "eps", b.real(o.eps));
  b.put(group, "weight_decay", b.real(o.weight_decay));
  b.put(group, "bias_correction", b.boolean(o.bias_correction));
  b.put(group, "amsgrad", b.boolean(false));
  b.put(group, "zinf_optimizer", b.str(optimizer_name(o.type)));
  PickleValue* ids = b.list();
  for (size_t u = 0; u < units.size(); ++u) b.doc().append(ids, b.integer(static_cast<int64_t>(u)));
  b.put(group, "params", ids);
  b.doc().append(groups, group);
  b.put(torch_state, "param_groups", groups);
  return torch_state;
}

// Stages 1/2: where each unit (a parameter's slice) lies in its parameter, as DeepSpeed's
// group_paddings, partition_count and param_slice_mappings say it.
void put_slice_mappings(FileBuilder& b, const SavedRun& run, PickleValue* d) {
  const std::vector<Unit>& units = run.view.units;
  const zero::PartitionLayout& layout = run.view.layout;
  PickleValue* paddings = b.list();
  PickleValue* counts = b.list();
  PickleValue* mappings = b.list();
  for (size_t u = 0; u < units.size(); ++u) {
    b.doc().append(paddings, b.integer(static_cast<int64_t>(units[u].numel - units[u].valid)));
    b.doc().append(counts, b.integer(layout.world_size()));
    PickleValue* m = b.dict(true);
    PickleValue* frag = b.dict();
    b.put(frag, "start", b.integer(static_cast<int64_t>(layout.slice(u).slice_begin)));
    b.put(frag, "numel", b.integer(static_cast<int64_t>(units[u].valid)));
    b.put(m, run.view.trainable[u]->name, frag);
    b.doc().append(mappings, m);
  }
  b.put(d, "group_paddings", paddings);
  b.put(d, "partition_count", counts);
  b.put(d, "param_slice_mappings", mappings);
}

// The module dict and what goes beside it in the model-states file.
struct ModuleEntries {
  PickleValue* module = nullptr;            // name -> tensor (stage 3: empty placeholders)
  PickleValue* buffer_names = nullptr;      // list
  PickleValue* shared = nullptr;            // alias -> name
  PickleValue* frozen_shapes = nullptr;     // name -> torch.Size
  PickleValue* frozen_fragments = nullptr;  // name -> this rank's fragment (stage 3) or all
  bool any_frozen = false;
};

// A frozen parameter's values as saved: whole at stages 0-2; at stage 3 this rank's
// fragment, a ceil(numel / world) slice zero-padded at the end.
at::Tensor frozen_fragment(const SavedRun& run, const zero::ZeroModel::Param& p) {
  at::Tensor flat = p.var.detach().to(at::kCPU).reshape({-1});
  if (run.stage == 3) {
    const int64_t slice = (static_cast<int64_t>(p.numel) + run.world - 1) / run.world;
    at::Tensor frag = at::zeros({slice}, flat.options());
    const int64_t begin = std::min<int64_t>(slice * run.rank, flat.numel());
    const int64_t n = std::min<int64_t>(slice, flat.numel() - begin);
    if (n > 0) frag.narrow(0, 0, n).copy_(flat.narrow(0, begin, n));
    flat = frag;
  } else {
    flat = p.var.detach().to(at::kCPU);
  }
  return flat;
}

ModuleEntries module_entries(FileBuilder& b, const SavedRun& run) {
  ModuleEntries e;
  e.module = b.dict(true);
  e.shared = b.dict();
  e.frozen_shapes = b.dict(true);
  e.frozen_fragments = b.dict(true);
  for (const auto& p : run.params) {
    PickleValue* t = run.stage == 3
                         ? b.tensor(at::empty({0}, at::TensorOptions().dtype(run.dtype)))
                         : b.tensor(p.var.detach().to(at::kCPU));  // a device's values: copied
    b.put(e.module, p.name, t);
    for (const std::string& alias : p.aliases) {
      b.put(e.module, alias, t);
      if (run.stage != 3 || run.rank == 0) b.put(e.shared, alias, b.str(p.name));
    }
    if (!p.trainable) {
      e.any_frozen = true;
      b.put(e.frozen_shapes, p.name, b.size(p.shape));
      b.put(e.frozen_fragments, p.name, b.tensor(frozen_fragment(run, p)));
    }
  }
  e.buffer_names = b.list();
  for (const auto& item : run.module.named_buffers()) {
    b.put(e.module, item.key(), b.tensor(item.value().to(at::kCPU)));
    b.doc().append(e.buffer_names, b.str(item.key()));
  }
  return e;
}

// param_shapes: at stage 3 per sub-group the parameters whose slice starts in it, in
// flattening order; below it one dict per trainable parameter.
PickleValue* param_shapes(FileBuilder& b, const SavedRun& run) {
  const zero::PartitionLayout& layout = run.view.layout;
  const std::vector<const zero::ZeroModel::Param*>& trainable = run.view.trainable;
  PickleValue* shapes = b.list();
  if (run.stage == 3) {
    size_t lp = 0;
    for (const auto& g : layout.sub_groups()) {
      PickleValue* d = b.dict(true);
      while (lp < trainable.size() && layout.slice(lp).partition_offset < g.offset + g.numel) {
        b.put(d, trainable[lp]->name, b.size(trainable[lp]->shape));
        ++lp;
      }
      b.doc().append(shapes, d);
    }
  } else {
    for (const auto* p : trainable) {
      PickleValue* d = b.dict(true);
      b.put(d, p->name, b.size(p->shape));
      b.doc().append(shapes, d);
    }
  }
  return shapes;
}

// zinf's own record: stage, optimizer, precision, applied steps, the CPU generator's state
// and, on a device, the device generator's.
PickleValue* zinf_record(FileBuilder& b, const SavedRun& run) {
  const zero::Precision precision = run.options.zero.precision;
  PickleValue* z = b.dict();
  b.put(z, "zero_stage", b.integer(run.stage));
  b.put(z, "optimizer", b.str(optimizer_name(run.options.optimizer.type)));
  b.put(z, "precision",
        b.str(precision == zero::Precision::kBFloat16  ? "bf16"
              : precision == zero::Precision::kFloat16 ? "fp16"
                                                       : "fp32"));
  b.put(z, "applied_steps", b.integer(run.applied_steps));
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    b.put(z, "rng_state", b.tensor(generator.get_state()));
  }
  if (!run.device.is_cpu()) {  // the device's generator too (a GPU's)
    at::Generator generator = at::globalContext().defaultGenerator(run.device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    b.put(z, "device_rng_state", b.tensor(generator.get_state().to(at::kCPU)));
  }
  return z;
}

void put_client_state(FileBuilder& b, PickleValue* root, const ClientState& client_state) {
  for (const auto& [key, value] : client_state) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            b.put(root, key, b.integer(v));
          } else if constexpr (std::is_same_v<T, double>) {
            b.put(root, key, b.real(v));
          } else {
            b.put(root, key, b.str(v));
          }
        },
        value);
  }
}

ClientValue client_value(const PickleValue& v) {
  switch (v.kind()) {
    case PickleValue::Kind::kInt:
      return v.as_int();
    case PickleValue::Kind::kBool:
      return static_cast<int64_t>(v.as_bool());
    case PickleValue::Kind::kFloat:
      return v.as_float();
    case PickleValue::Kind::kString:
      return v.as_string();
    default:
      return std::string(v.kind_name());
  }
}

}  // namespace

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string optimizer_name(optimizer_cpu::OptimizerKind kind) {
  return lower(std::string(optimizer_cpu::to_string(kind)));
}

// ---- writing ----------------------------------------------------------------------------------

void check_client_keys(const ClientState& client_state) {
  for (const auto& [key, value] : client_state) {
    if (reserved_keys().count(key) != 0) {
      throw EngineError(
          fmt::format("checkpoint client state key \"{}\" is one of DeepSpeed's", key));
    }
  }
}

PickleValue* ds_config(FileBuilder& b, const SavedRun& run) {
  const EngineOptions& options = run.options;
  PickleValue* c = b.dict();
  b.put(c, "train_micro_batch_size_per_gpu", b.integer(options.micro_batch_size));
  b.put(c, "gradient_accumulation_steps", b.integer(options.zero.gradient_accumulation_steps));
  PickleValue* z = b.dict();
  b.put(z, "stage", b.integer(run.stage));
  b.put(z, "sub_group_size", b.integer(static_cast<int64_t>(options.zero.sub_group_size)));
  b.put(c, "zero_optimization", z);
  PickleValue* o = b.dict();
  b.put(o, "type", b.str(std::string(optimizer_cpu::to_string(options.optimizer.type))));
  b.put(c, "optimizer", o);
  PickleValue* bf = b.dict();
  b.put(bf, "enabled", b.boolean(options.zero.precision == zero::Precision::kBFloat16));
  b.put(c, "bf16", bf);
  PickleValue* fp = b.dict();
  b.put(fp, "enabled", b.boolean(options.zero.precision == zero::Precision::kFloat16));
  b.put(c, "fp16", fp);
  return c;
}

PickleValue* optimizer_dict(FileBuilder& b, const SavedRun& run, PartitionKeys* keys) {
  keys->assign(1 + run.view.states.size(), std::vector<std::string>(run.view.units.size()));
  PickleValue* flat = b.list();
  PickleValue* torch_state = torch_optimizer_state(b, run, flat, *keys);
  PickleValue* d = b.dict();
  b.put(d, "zero_stage", b.integer(run.stage));
  b.put(d, "loss_scaler", loss_scaler_object(b, run.scaler));
  b.put(d, "dynamic_loss_scale", b.boolean(run.scaler.dynamic()));
  b.put(d, "overflow", b.boolean(false));
  if (run.stage == 3) {
    b.put(d, "partition_count", b.integer(run.world));
    b.put(d, "optimizer_state_dict", torch_state);
    b.put(d, "fp32_flat_groups", flat);
  } else {
    b.put(d, "clip_grad", b.real(run.options.zero.gradient_clipping));
    b.put(d, "base_optimizer_state", torch_state);
    b.put(d, "single_partition_of_fp32_groups", flat);
    put_slice_mappings(b, run, d);
  }
  return d;
}

PickleValue* model_states_dict(FileBuilder& b, const SavedRun& run, const ClientState& client_state,
                               PartitionKeys* keys) {
  PickleValue* root = b.dict();
  const ModuleEntries e = module_entries(b, run);
  b.put(root, "module", e.module);
  b.put(root, "buffer_names", e.buffer_names);
  b.put(root, "param_shapes", param_shapes(b, run));
  b.put(root, "frozen_param_shapes", e.any_frozen ? e.frozen_shapes : b.none());
  b.put(root, "frozen_param_fragments", e.any_frozen ? e.frozen_fragments : b.none());
  b.put(root, "shared_params", e.shared);
  b.put(root, "optimizer", run.stage == 0 ? optimizer_dict(b, run, keys) : b.none());
  PickleValue* sched = b.dict();
  b.put(sched, "last_batch_iteration", b.integer(run.applied_steps - 1));
  b.put(root, "lr_scheduler", sched);
  b.put(root, "data_sampler", b.none());
  b.put(root, "random_ltd", b.none());
  b.put(root, "sparse_tensor_module_names", b.doc().set());
  b.put(root, "skipped_steps", b.integer(run.skipped_steps));
  b.put(root, "global_steps", b.integer(run.global_steps));
  b.put(root, "global_samples", b.integer(run.global_samples));
  b.put(root, "dp_world_size", b.integer(run.world));
  b.put(root, "mp_world_size", b.integer(1));
  b.put(root, "ds_config", ds_config(b, run));
  b.put(root, "ds_version", b.str(kVersion));
  b.put(root, "zinf", zinf_record(b, run));
  put_client_state(b, root, client_state);
  return root;
}

PickleValue* optim_states_dict(FileBuilder& b, const SavedRun& run, PartitionKeys* keys) {
  PickleValue* root = b.dict();
  b.put(root, "optimizer_state_dict", optimizer_dict(b, run, keys));
  b.put(root, "ds_config", ds_config(b, run));
  b.put(root, "ds_version", b.str(kVersion));
  return root;
}

// ---- reading ----------------------------------------------------------------------------------

void collect_shapes(const PickleValue& v,
                    std::vector<std::pair<std::string, std::vector<int64_t>>>& out) {
  if (v.is_none()) return;
  if (v.is(PickleValue::Kind::kList) || v.is(PickleValue::Kind::kTuple)) {
    for (const PickleValue* item : v.items()) collect_shapes(*item, out);
    return;
  }
  for (const ser::PickleEntry& e : v.entries()) {
    out.emplace_back(e.key->as_string(), e.value->as_int_list());
  }
}

const ser::TensorRef& state_tensor(const PickleValue& state, int64_t index, const char* name,
                                   const std::string& file) {
  for (const ser::PickleEntry& e : state.entries()) {
    if (e.key->is(PickleValue::Kind::kInt) && e.key->as_int() == index) {
      return e.value->at(name).tensor();
    }
  }
  throw EngineError(fmt::format("{}: the optimizer state has no entry {}", file, index));
}

int64_t saved_zero_stage(const PickleValue& inner) {
  const PickleValue& saved = inner.at("zero_stage");
  return saved.is(PickleValue::Kind::kObject) && saved.args().size() == 1
             ? saved.args().items()[0]->as_int()
             : saved.as_int();
}

zero::LossScaler::State saved_loss_scaler(const PickleValue& inner) {
  // DeepSpeed's scaler object (its attributes in BUILD's state; a static LossScaler has
  // only cur_scale and dynamic), or the dict zinf wrote before it wrote that object.
  const PickleValue& saved = inner.at("loss_scaler");
  const PickleValue& ls =
      saved.is(PickleValue::Kind::kObject) && saved.state() != nullptr ? *saved.state() : saved;
  auto int_or = [&](std::string_view key, int64_t fallback) {
    const PickleValue* v = ls.find(key);
    return v != nullptr && !v->is(PickleValue::Kind::kNone) ? v->as_int() : fallback;
  };
  zero::LossScaler::State s;
  s.scale = ls.at("cur_scale").as_float();
  s.iteration = int_or("cur_iter", 0);
  s.last_overflow_iteration = int_or("last_overflow_iter", -1);
  s.hysteresis_left = static_cast<int>(int_or("cur_hysteresis", 1));
  return s;
}

const PickleValue* ds_config_optimizer_type(const PickleValue& root) {
  const PickleValue* ds_config = root.find("ds_config");
  const PickleValue* optimizer = ds_config != nullptr && ds_config->is(PickleValue::Kind::kDict)
                                     ? ds_config->find("optimizer")
                                     : nullptr;
  return optimizer != nullptr && optimizer->is(PickleValue::Kind::kDict) ? optimizer->find("type")
                                                                         : nullptr;
}

ClientState saved_client_state(const PickleValue& root) {
  ClientState out;
  for (const ser::PickleEntry& e : root.entries()) {
    if (e.key->is(PickleValue::Kind::kString) && reserved_keys().count(e.key->as_string()) == 0) {
      out[e.key->as_string()] = client_value(*e.value);
    }
  }
  return out;
}

}  // namespace zinf::engine::checkpoint
