// Checkpointer::load: one load, in its steps — open the model-states file and check that it
// fits the run (zinf's file, or DeepSpeed's at stage 3), match the trainable and frozen
// parameters by name, open the optimizer-states file and map its unit tensors onto this
// rank's partition, restore the partition (CRC-32 checked), the frozen parameters, and the
// counters, loss scale and RNG state (engine/checkpoint.h: what loads and what is refused).
//
// Collectives, in this order on every rank: refresh_from_master, host_all_gather per frozen
// parameter (stage 3, world > 1), host_all_reduce (bytes; world > 1).

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "aio/handle.h"
#include "engine/checkpoint/checkpointer.h"
#include "engine/checkpoint/deepspeed_layout.h"
#include "engine/checkpoint/file_builder.h"
#include "engine/checkpoint/folder.h"
#include "engine/checkpoint/partition_stream.h"
#include "serialization/torch_archive.h"
#include "zero/device_tensor.h"
#include "zero/error.h"
#include "zero/host_collectives.h"

namespace zinf::engine::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace ser = zinf::serialization;
using ser::PickleValue;
using Clock = std::chrono::steady_clock;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

zero::DType comm_dtype(at::ScalarType t, const std::string& file) {
  try {
    return zero::dtype_of(t);
  } catch (const zero::ZeroError&) {
    throw EngineError(
        fmt::format("{}: a frozen parameter of {} cannot be gathered", file, c10::toString(t)));
  }
}

// `numel` elements of `dtype` in an archive's `bytes`, as a CPU tensor of their own (a copy).
at::Tensor tensor_of(std::span<const uint8_t> bytes, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(const_cast<uint8_t*>(bytes.data()), {numel},
                       at::TensorOptions().dtype(dtype))
      .clone();
}

void restore_generator(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// The folder of checkpoint `tag` under `root`: `<root>/<tag>`, or the replaced one moved aside
// by a save that could not exchange and was cut short.
fs::path find_folder(const fs::path& root, const std::string& tag) {
  fs::path folder = root / tag;
  std::error_code ec;
  if (!fs::is_directory(folder, ec) && fs::is_directory(aside_folder(root, tag), ec)) {
    folder = aside_folder(root, tag);  // a save that could not exchange was cut short
  }
  if (!fs::is_directory(folder, ec)) {
    throw EngineError(fmt::format("checkpoint {}: no such folder", folder.string()));
  }
  return folder;
}

// Index of each name of `a` in `b`, or an error naming what is missing or differs.
std::vector<size_t> match_names(const Shapes& a, const Shapes& b, const char* what,
                                const std::string& model_file) {
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!at.emplace(b[i].first, i).second) {
      throw EngineError(fmt::format("{}: the checkpoint names {} parameter \"{}\" twice",
                                    model_file, what, b[i].first));
    }
  }
  std::vector<size_t> index;
  for (const auto& [name, shape] : a) {
    const auto it = at.find(name);
    if (it == at.end()) {
      throw EngineError(fmt::format("{}: the model's {} parameter \"{}\" is not in the checkpoint",
                                    model_file, what, name));
    }
    if (b[it->second].second != shape) {
      throw EngineError(
          fmt::format("{}: parameter \"{}\" has shape {} in the checkpoint, {} in the model",
                      model_file, name, shape_text(b[it->second].second), shape_text(shape)));
    }
    index.push_back(it->second);
  }
  if (b.size() > a.size()) {
    std::vector<bool> used(b.size(), false);
    for (size_t i : index) used[i] = true;
    const auto spare = std::find(used.begin(), used.end(), false) - used.begin();
    throw EngineError(fmt::format("{}: the checkpoint's {} parameter \"{}\" is not in the model",
                                  model_file, what, b[static_cast<size_t>(spare)].first));
  }
  return index;
}

// Checks that every unit tensor is fp32, starts at 0, and has the unit's storage size.
void check_units(const std::vector<const ser::TensorRef*>& refs, const std::vector<Unit>& units,
                 const std::string& file, const char* what) {
  if (refs.size() != units.size()) {
    throw EngineError(fmt::format("{}: {} holds {} tensors, this run's partition has {}", file,
                                  what, refs.size(), units.size()));
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const ser::TensorRef& r = *refs[u];
    if (r.storage.dtype != ser::TensorDType::kFloat32 || r.storage_offset != 0 ||
        static_cast<uint64_t>(r.storage.numel) != units[u].numel) {
      throw EngineError(fmt::format(
          "{}: {}[{}] is a {} storage of {} elements at offset {}; this run's partition needs "
          "float32 storage of {} elements",
          file, what, u, ser::dtype_name(r.storage.dtype), r.storage.numel, r.storage_offset,
          units[u].numel));
    }
  }
}

}  // namespace

// One load in progress: the files it opened and what it found in them.
class Checkpointer::Load {
 public:
  Load(Checkpointer& c, fs::path folder) : e_(c.e_), folder_(std::move(folder)), run_(e_) {}

  // Opens this rank's model-states file and checks that it fits the run.
  void open_model_states();
  // The checkpoint's trainable parameters, matched to this run's by name; frozen ones too.
  void match_parameters();
  // Opens the optimizer states (stage 0: inside the model-states file) and checks them.
  void open_optimizer_states();
  // Where this rank's partition lies in the optimizer file's unit tensors.
  void map_partition();
  void restore_partition();
  // Frozen parameters: whole at stages 0-2, this rank's fragment at stage 3.
  void restore_frozen();
  // Step counters, loss scale, RNG state.
  void restore_counters();
  // The client state and the bytes of all ranks' files.
  CheckpointReport report();

 private:
  void check_deepspeed_record();
  void check_zinf_record();
  // A generator's state saved in the model-states file (a byte tensor).
  at::Tensor rng_state(const PickleValue& saved) const;

  EngineParts& e_;
  const fs::path folder_;
  const Run run_;
  // The model-states file.
  fs::path model_path_;
  std::string model_file_;
  std::optional<ser::TorchArchive> model_archive_;
  const PickleValue* m_ = nullptr;  // its root dict
  const PickleValue* z_ = nullptr;  // its `zinf` record
  bool deepspeed_ = false;          // written by DeepSpeed (no `zinf` record)
  // saved_index_[p]: where this run's trainable parameter p (layout order) is in param_shapes.
  Shapes saved_shapes_;
  std::vector<size_t> saved_index_;
  // The optimizer states: their file, its archive (the model-states one at stage 0), the
  // inner optimizer dict, the unit tensors of each array and where they hold the partition.
  std::optional<ser::TorchArchive> optim_archive_;
  std::string optim_file_;
  const PickleValue* inner_ = nullptr;
  const PickleValue* torch_state_ = nullptr;
  std::vector<std::vector<const ser::TensorRef*>> refs_;  // [array][unit]
  std::vector<Source> sources_;
};

void Checkpointer::Load::open_model_states() {
  std::error_code ec;
  model_path_ = folder_ / model_states_file(run_.stage, run_.rank);
  if (!fs::exists(model_path_, ec)) {
    const fs::path other = folder_ / model_states_file(run_.stage == 3 ? 0 : 3, 0);
    if (fs::exists(other, ec)) {
      throw EngineError(fmt::format(
          "checkpoint {}: {} is missing but {} exists: it was saved at ZeRO stage {}, this run "
          "is stage {}",
          folder_.string(), model_path_.filename().string(), other.filename().string(),
          run_.stage == 3 ? "0-2" : "3", run_.stage));
    }
    throw EngineError(fmt::format("checkpoint {}: {} is missing", folder_.string(),
                                  model_path_.filename().string()));
  }
  model_file_ = model_path_.string();
  model_archive_.emplace(ser::TorchArchive::open(model_file_));
  m_ = &model_archive_->root();
  if (m_->find("buffer_names") == nullptr) {
    throw EngineError(fmt::format("{}: not a model-states file (no buffer_names)", model_file_));
  }
  const int64_t saved_world = m_->at("dp_world_size").as_int();
  if (saved_world != run_.world) {
    throw EngineError(fmt::format(
        "{}: saved with world size {} (dp_world_size), this run has {}; loading into another "
        "world size is not supported (consolidate with zinf zero-to-fp32 instead)",
        model_file_, saved_world, run_.world));
  }
  // zinf's files carry a `zinf` record (stage, optimizer, applied steps, RNG states). A
  // checkpoint DeepSpeed wrote has none: its stage is in the optimizer-states file (as its
  // ZeroStageEnum), its optimizer in ds_config, and it has no RNG state of zinf's.
  z_ = m_->find("zinf");
  deepspeed_ = z_ == nullptr;
  if (deepspeed_) {
    check_deepspeed_record();
  } else {
    check_zinf_record();
  }
}

void Checkpointer::Load::check_deepspeed_record() {
  const std::string mine = optimizer_name(e_.options.optimizer.type);
  const PickleValue* version = m_->find("ds_version");
  if (version == nullptr) {
    throw EngineError(fmt::format(
        "{}: neither zinf's nor DeepSpeed's model-states file (no zinf record, no ds_version)",
        model_file_));
  }
  if (run_.stage != 3) {
    throw EngineError(fmt::format(
        "{}: written by DeepSpeed {}, whose checkpoints zinf loads at ZeRO stage 3 only (its "
        "stages 0-2 cut the partitions from the flattened groups, zinf's per parameter); this "
        "run is stage {}: consolidate it with zinf zero-to-fp32 and start from that with "
        "--init-from (the optimizer's states are then not carried over)",
        model_file_, version->is(PickleValue::Kind::kString) ? version->as_string() : "?",
        run_.stage));
  }
  const PickleValue* type = ds_config_optimizer_type(*m_);
  if (type == nullptr || !type->is(PickleValue::Kind::kString)) {
    throw EngineError(fmt::format(
        "{}: its ds_config names no optimizer (ds_config.optimizer.type): zinf cannot tell "
        "whether its states are this run's {}",
        model_file_, mine));
  }
  if (lower(type->as_string()) != mine) {
    throw EngineError(fmt::format("{}: saved with optimizer {} (ds_config), this run uses {}",
                                  model_file_, lower(type->as_string()), mine));
  }
}

void Checkpointer::Load::check_zinf_record() {
  const int64_t saved_stage = z_->at("zero_stage").as_int();
  if (saved_stage != run_.stage) {
    throw EngineError(fmt::format("{}: saved at ZeRO stage {}, this run is stage {}", model_file_,
                                  saved_stage, run_.stage));
  }
  const std::string saved_optimizer = z_->at("optimizer").as_string();
  if (saved_optimizer != optimizer_name(e_.options.optimizer.type)) {
    throw EngineError(fmt::format("{}: saved with optimizer {}, this run uses {}", model_file_,
                                  saved_optimizer, optimizer_name(e_.options.optimizer.type)));
  }
}

void Checkpointer::Load::match_parameters() {
  collect_shapes(m_->at("param_shapes"), saved_shapes_);
  Shapes frozen_saved;
  if (const PickleValue* f = m_->find("frozen_param_shapes")) collect_shapes(*f, frozen_saved);
  Shapes mine, frozen_mine;
  for (const auto* p : run_.view.trainable) mine.emplace_back(p->name, p->shape);
  for (const auto& p : e_.model.params()) {
    if (!p.trainable) frozen_mine.emplace_back(p.name, p.shape);
  }
  saved_index_ = match_names(mine, saved_shapes_, "trainable", model_file_);
  (void)match_names(frozen_mine, frozen_saved, "frozen", model_file_);
}

void Checkpointer::Load::open_optimizer_states() {
  const std::string mine = optimizer_name(e_.options.optimizer.type);
  optim_file_ = model_file_;
  if (run_.stage == 0) {
    inner_ = &m_->at("optimizer");
  } else {
    std::error_code ec;
    fs::path path = folder_ / optim_states_file(run_.rank, run_.bf16);
    if (deepspeed_ && !fs::exists(path, ec)) {
      path = folder_ / optim_states_file(run_.rank,
                                         !run_.bf16);  // DeepSpeed's stage 3 has no bf16_ names
    }
    optim_file_ = path.string();
    if (!fs::exists(path, ec)) {
      throw EngineError(
          fmt::format("checkpoint {}: {} is missing{}", folder_.string(), path.filename().string(),
                      fs::exists(folder_ / optim_states_file(run_.rank, !run_.bf16), ec)
                          ? " (the checkpoint's precision differs from this run's)"
                          : ""));
    }
    optim_archive_.emplace(ser::TorchArchive::open(optim_file_));
    inner_ = &optim_archive_->root().at("optimizer_state_dict");
  }
  const int64_t inner_stage = saved_zero_stage(*inner_);
  if (inner_stage != run_.stage) {
    throw EngineError(fmt::format("{}: zero_stage {}, this run is stage {}", optim_file_,
                                  inner_stage, run_.stage));
  }
  torch_state_ = &inner_->at(run_.stage == 3 ? "optimizer_state_dict" : "base_optimizer_state");
  const PickleValue& groups = torch_state_->at("param_groups");
  if (!deepspeed_ &&
      (groups.size() < 1 || groups.items()[0]->at("zinf_optimizer").as_string() != mine)) {
    throw EngineError(fmt::format("{}: the optimizer state is not of this run's optimizer {}",
                                  optim_file_, mine));
  }
}

// The checkpoint's partition of this rank: its parameters in param_shapes order, and its unit
// tensors — at stage 3 the sub-groups it was cut into (their sizes are the file's), below it
// one per parameter slice.
void Checkpointer::Load::map_partition() {
  const zero::PartitionLayout& layout = run_.view.layout;
  refs_.assign(1 + run_.view.states.size(), {});
  const char* flat_name = run_.stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  for (const PickleValue* t : inner_->at(flat_name).items()) refs_[0].push_back(&t->tensor());
  std::vector<uint64_t> saved_numels;
  for (const auto& [name, shape] : saved_shapes_) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    saved_numels.push_back(n);
  }
  const zero::PartitionLayout saved_layout(saved_numels, layout.world_size(), layout.rank(),
                                           layout.partition_numel() + 1);
  std::vector<Unit> saved_units;
  if (run_.stage == 3) {
    uint64_t offset = 0;
    for (const ser::TensorRef* r : refs_[0]) {
      const auto numel = static_cast<uint64_t>(std::max<int64_t>(r->storage.numel, 0));
      saved_units.push_back({offset, numel, numel});
      offset += numel;
    }
    if (offset < saved_layout.partition_numel()) {
      throw EngineError(
          fmt::format("{}: {} holds {} elements; the parameters of param_shapes need {} on rank {}",
                      optim_file_, flat_name, offset, saved_layout.partition_numel(), run_.rank));
    }
  } else {
    saved_units = partition_units(saved_layout, run_.stage);
  }
  check_units(refs_[0], saved_units, optim_file_, flat_name);
  const PickleValue& st = torch_state_->at("state");
  for (size_t a = 0; a < run_.view.states.size(); ++a) {
    const char* name = run_.view.states[a].name;
    for (size_t u = 0; u < saved_units.size(); ++u) {
      refs_[1 + a].push_back(&state_tensor(st, static_cast<int64_t>(u), name, optim_file_));
    }
    check_units(refs_[1 + a], saved_units, optim_file_, name);
  }
  sources_ = map_sources(layout, saved_index_, saved_layout, saved_units);
}

void Checkpointer::Load::restore_partition() {
  AlignedFloats buffers[2];
  const ser::TorchArchive& archive = run_.stage == 0 ? *model_archive_ : *optim_archive_;
  const std::string& archive_file = run_.stage == 0 ? model_file_ : optim_file_;
  aio::AioHandle io(e_.options.zero.aio);
  stream_in(run_.view.swapper, offload::OptimizerState::kParams, run_.view.layout, sources_,
            refs_[0], archive, archive_file, io, buffers);
  for (size_t a = 0; a < run_.view.states.size(); ++a) {
    stream_in(run_.view.swapper, run_.view.states[a].state, run_.view.layout, sources_,
              refs_[1 + a], archive, archive_file, io, buffers);
  }
  e_.model.refresh_from_master();
}

void Checkpointer::Load::restore_frozen() {
  const PickleValue* found = m_->find("frozen_param_fragments");
  if (found == nullptr || found->is_none()) return;
  const PickleValue& fragments = *found;
  torch::NoGradGuard no_grad;
  for (const auto& p : e_.model.params()) {
    if (p.trainable) continue;
    const ser::TensorRef& ref = fragments.at(p.name).tensor();
    const auto bytes = model_archive_->tensor_bytes(ref);
    at::Tensor saved = tensor_of(bytes, ref.numel(), scalar_of(ref.storage.dtype, model_file_));
    at::Tensor full = saved;
    if (run_.stage == 3 && run_.world > 1) {
      full = at::empty({saved.numel() * run_.world}, saved.options());
      zero::host_all_gather(e_.comm, e_.accelerator, saved.data_ptr(), full.data_ptr(),
                            static_cast<size_t>(saved.numel()),
                            comm_dtype(saved.scalar_type(), model_file_));
    }
    if (full.numel() < static_cast<int64_t>(p.numel)) {
      throw EngineError(fmt::format("{}: frozen parameter \"{}\" holds {} elements, not {}",
                                    model_file_, p.name, full.numel(), p.numel));
    }
    p.var.copy_(full.narrow(0, 0, static_cast<int64_t>(p.numel)).view(p.shape));
  }
}

void Checkpointer::Load::restore_counters() {
  StepCounters& n = e_.counters;
  n.global_steps = m_->at("global_steps").as_int();
  n.global_samples = m_->at("global_samples").as_int();
  n.skipped_steps = m_->at("skipped_steps").as_int();
  // DeepSpeed counts the steps its optimizer skipped (fp16 overflows) among global_steps.
  n.applied_steps =
      deepspeed_ ? n.global_steps - n.skipped_steps : z_->at("applied_steps").as_int();
  e_.scaler.restore(saved_loss_scaler(*inner_));
  if (deepspeed_) return;  // DeepSpeed's files hold no RNG state: the generators go on as they are
  restore_generator(at::detail::getDefaultCPUGenerator(), rng_state(z_->at("rng_state")));
  if (const PickleValue* device_rng = z_->find("device_rng_state");
      device_rng != nullptr && !e_.device.is_cpu()) {
    restore_generator(at::globalContext().defaultGenerator(e_.device), rng_state(*device_rng));
  }
}

at::Tensor Checkpointer::Load::rng_state(const PickleValue& saved) const {
  const ser::TensorRef& ref = saved.tensor();
  return tensor_of(model_archive_->tensor_bytes(ref), ref.numel(), at::kByte);
}

CheckpointReport Checkpointer::Load::report() {
  CheckpointReport report;
  report.client_state = saved_client_state(*m_);
  // Files counted once: below stage 3 every rank reads rank 0's model-states file.
  int64_t bytes =
      run_.stage == 3 || run_.rank == 0 ? static_cast<int64_t>(fs::file_size(model_path_)) : 0;
  if (run_.stage >= 1) bytes += static_cast<int64_t>(fs::file_size(optim_file_));
  if (run_.world > 1) {
    zero::host_all_reduce(e_.comm, e_.accelerator, &bytes, 1, zero::DType::kInt64,
                          zero::ReduceOp::kSum);
  }
  report.path = folder_.string();
  report.bytes = static_cast<uint64_t>(bytes);
  return report;
}

CheckpointReport Checkpointer::load(const std::string& dir, const std::string& tag_in) {
  const Clock::time_point start = Clock::now();
  const fs::path root(dir);
  const std::string tag = tag_in.empty() ? read_latest(root) : tag_in;
  check_tag(tag);
  Load load(*this, find_folder(root, tag));
  load.open_model_states();
  load.match_parameters();
  load.open_optimizer_states();
  load.map_partition();
  load.restore_partition();
  load.restore_frozen();
  load.restore_counters();
  CheckpointReport report = load.report();
  report.tag = tag;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace zinf::engine::checkpoint
