#include "zero/zero_model.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "zero/comm/torch_dtype.h"
#include "zero/device_tensor.h"
#include "zero/dtype_convert.h"
#include "zero/error.h"
#include "zero/host_collectives.h"

namespace zinf::zero {
namespace {

using detail::scalar_type;

bool under(const std::string& name, const std::string& prefix) {
  if (prefix.empty()) {
    return true;
  }
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         name[prefix.size()] == '.';
}

}  // namespace

ZeroModel::ZeroModel(torch::nn::Module& root, const ZeroConfig& config,
                     offload::Accelerator& accelerator, Communicator& comm,
                     optimizer_cpu::Optimizer& optimizer, const Initializer& initializer)
    : config_(config),
      accelerator_(accelerator),
      comm_(comm),
      cpu_optimizer_(optimizer),
      dtype_(zero::compute_dtype(config.precision)) {
  if (config_.stage < 0 || config_.stage > 3) {
    throw ZeroError(
        fmt::format("zero_optimization.stage must be 0, 1, 2 or 3, not {}", config_.stage));
  }
  if (config_.offload_param != OffloadTarget::kNone && config_.stage != 3) {
    throw ZeroError(fmt::format(
        "zero_optimization.offload_param needs stage 3 (the stage is {}): below stage 3 every "
        "rank keeps the full parameters",
        config_.stage));
  }
  if (config_.gradient_accumulation_steps < 1) {
    throw ZeroError(fmt::format("gradient_accumulation_steps must be >= 1, not {}",
                                config_.gradient_accumulation_steps));
  }
  copy_stream_ = accelerator_.create_stream();
  collect(root);
  partition(initializer);
  for (size_t b = 0; b < blocks_.size(); ++b) {
    blocks_[b].module->attach(this, b);
  }
}

ZeroModel::~ZeroModel() {
  for (Block& block : blocks_) {
    block.module->attach(nullptr, 0);
  }
  if (coordinator_) {
    coordinator_->reset();
  }
  // Resident parameters point into device buffers that go with this object: give the model
  // copies it owns, so it stays usable (stage 3's managed parameters stay empty).
  for (Param& p : params_) {
    if (p.storage.size() > 0) {
      torch::NoGradGuard no_grad;
      p.var.set_data(p.var.detach().clone());
    }
  }
}

// ---- attaching -------------------------------------------------------------------------

ModelDescription describe_model(torch::nn::Module& root) {
  ModelDescription d;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (auto* block = dynamic_cast<ZeroBlockImpl*>(item.value().get())) {
      if (block->model() != nullptr) {
        throw ZeroError(
            fmt::format("block \"{}\" is already attached to another ZeroModel", item.key()));
      }
      for (const std::string& path : d.block_paths) {
        if (under(item.key(), path)) {
          throw ZeroError(
              fmt::format("block \"{}\" is nested in block \"{}\": blocks must not contain blocks",
                          item.key(), path));
        }
      }
      d.blocks.push_back(block);
      d.block_paths.push_back(item.key());
    }
  }
  std::unordered_map<const void*, size_t> index;  // TensorImpl -> d.params index
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const torch::Tensor& tensor = item.value();
    const void* impl = tensor.unsafeGetTensorImpl();
    auto found = index.find(impl);
    size_t i = 0;
    if (found == index.end()) {
      if (tensor.numel() == 0 && tensor.requires_grad()) {
        throw ZeroError(fmt::format("parameter \"{}\" has no elements", name));
      }
      i = d.params.size();
      index.emplace(impl, i);
      d.params.push_back({name, {}, tensor, {}, false});
    } else {
      i = found->second;
      d.params[i].aliases.push_back(name);
    }
    bool inside = false;
    for (size_t b = 0; b < d.blocks.size(); ++b) {
      if (under(name, d.block_paths[b])) {
        inside = true;
        std::vector<size_t>& blocks = d.params[i].blocks;
        if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) {
          blocks.push_back(b);
        }
      }
    }
    if (!inside) {
      d.params[i].outside_use = true;
      ++d.params[i].outside_names;
    }
  }
  return d;
}

void ZeroModel::collect(torch::nn::Module& root) {
  ModelDescription d = describe_model(root);
  for (ZeroBlockImpl* block : d.blocks) {
    blocks_.push_back(Block{block, {}, {}});
  }
  for (ModelDescription::Parameter& described : d.params) {
    Param p;
    p.name = described.name;
    p.aliases = std::move(described.aliases);
    p.shape = described.tensor.sizes().vec();
    p.numel = static_cast<uint64_t>(described.tensor.numel());
    p.trainable = described.tensor.requires_grad();
    p.var = described.tensor;
    p.blocks = std::move(described.blocks);
    p.outside_use = described.outside_use;
    p.tied_outside = described.tied_outside();
    for (size_t b : p.blocks) {
      blocks_[b].params.push_back(params_.size());
      blocks_[b].tensors.push_back(p.var);
    }
    params_.push_back(std::move(p));
  }
}

// Partitioning, in order: the layout (which parameters are sliced, and where each slice
// lies), the tiers the slices live in, the initial values, the coordinator of the managed
// parameters, and the gradient routes.
void ZeroModel::partition(const Initializer& initializer) {
  lay_out();
  build_tiers();
  place_initial_values(initializer);
  if (store_) build_coordinator();
  route_gradients();
}

void ZeroModel::lay_out() {
  const bool stage0 = config_.stage == 0;
  std::vector<uint64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.trainable) {
      continue;
    }
    p.layout_index = static_cast<long>(trainable_.size());
    trainable_.push_back(i);
    numels.push_back(p.numel);
    if (config_.stage == 3 && !p.outside_use && !p.blocks.empty()) {
      p.managed = static_cast<long>(managed_.size());
      managed_.push_back(i);
    }
  }
  if (trainable_.empty()) {
    throw ZeroError("the model has no trainable parameters");
  }
  layout_ = std::make_unique<PartitionLayout>(numels, stage0 ? 1 : comm_.world_size(),
                                              stage0 ? 0 : comm_.rank(), config_.sub_group_size);
}

// The swap stores of the tiers on NVMe, the param swapper, the activation offload, the
// partitioned optimizer over the layout and the store of the managed parameters.
void ZeroModel::build_tiers() {
  auto make_store = [&](ZeroConfig::SwapTier tier) {
    offload::NvmeStoreConfig sc;
    sc.nvme_paths = config_.swap_folders(tier);
    sc.rank = comm_.rank();
    sc.name = ZeroConfig::swap_tier_name(tier);
    sc.aio = config_.aio;
    sc.checksums = config_.swap_checksums;
    return std::make_unique<offload::NvmeStore>(sc);
  };
  if (config_.offload_optimizer == OffloadTarget::kNvme) {
    optimizer_nvme_ = make_store(ZeroConfig::SwapTier::kOptimizer);
  }
  if (!managed_.empty() && config_.offload_param == OffloadTarget::kNvme) {
    param_nvme_ = make_store(ZeroConfig::SwapTier::kParam);
    param_swapper_ = std::make_unique<offload::ParamSwapper>(param_swapper_config(config_),
                                                             *param_nvme_, &accelerator_);
  }
  if (config_.activation_offload == OffloadTarget::kNvme) {
    activation_nvme_ = make_store(ZeroConfig::SwapTier::kActivation);
  }
  if (config_.activation_offload != OffloadTarget::kNone) {
    activation_offload_ =
        std::make_unique<ActivationOffload>(config_.activation_offload, activation_nvme_.get());
  }
  optimizer_ = std::make_unique<PartitionedOptimizer>(*layout_, config_, cpu_optimizer_,
                                                      optimizer_nvme_.get(), &accelerator_, comm_,
                                                      config_.stage == 0);
  if (!managed_.empty()) {
    ParamStore::Options so;
    so.tier = config_.offload_param;
    so.dtype = dtype_;
    std::vector<size_t> layout_params;
    for (size_t i : managed_) {
      layout_params.push_back(static_cast<size_t>(params_[i].layout_index));
    }
    store_ = std::make_unique<ParamStore>(so, *layout_, std::move(layout_params), accelerator_,
                                          comm_, param_swapper_.get());
  }
}

// Every parameter's initial values: full fp32 (rank 0's, or the initializer's), this rank's
// slice to the optimizer, and the compute-precision copy to where the parameter lives.
void ZeroModel::place_initial_values(const Initializer& initializer) {
  const int world = comm_.world_size();
  const size_t element = dtype_size(dtype_);
  std::vector<float> slice;
  std::vector<std::byte> slice16;
  for (size_t i : trainable_) {
    Param& p = params_[i];
    const ParamSlice& s = layout_->slice(static_cast<size_t>(p.layout_index));
    torch::Tensor full;
    {
      torch::NoGradGuard no_grad;
      if (initializer) {
        full = torch::empty(p.shape, torch::TensorOptions().dtype(at::kFloat));
        initializer(p.name, full);
        full = full.contiguous();
      } else {
        full = p.var.detach().to(at::kFloat).contiguous().clone();
      }
    }
    if (world > 1) {
      host_broadcast(comm_, accelerator_, full.data_ptr(), p.numel, DType::kFloat32, 0);
    }
    const float* values = full.data_ptr<float>();
    slice.assign(s.slice_numel, 0.0f);
    std::memcpy(slice.data(), values + s.slice_begin, s.valid_numel * sizeof(float));
    optimizer_->append_master(slice.data(), s.slice_numel);
    if (p.managed >= 0) {
      slice16.resize(s.slice_numel * element);
      from_float(slice.data(), slice16.data(), dtype_, s.slice_numel);
      store_->set_slice(static_cast<size_t>(p.managed), slice16.data());
      unbind(p);
    } else {
      const uint64_t padded = s.slice_numel * static_cast<uint64_t>(layout_->world_size());
      p.storage = accelerator_.allocate(padded * element, p.name);
      std::vector<std::byte> host(padded * element, std::byte{0});
      from_float(values, host.data(), dtype_, p.numel);
      accelerator_.copy_to_device(p.storage.data(), host.data(), host.size(), *copy_stream_);
      copy_stream_->synchronize();
      bind(p, p.storage.data());
    }
  }
  optimizer_->finish_master();
}

// The coordinator of the managed parameters: which stay gathered (persistence thresholds, in
// managed order), which each block uses, and the store's bind/unbind callbacks.
void ZeroModel::build_coordinator() {
  std::vector<uint64_t> numels_managed;
  for (size_t i : managed_) {
    numels_managed.push_back(params_[i].numel);
  }
  std::vector<bool> persistent = ParamCoordinator::persistent_params(
      numels_managed, config_.param_persistence_threshold, config_.model_persistence_threshold);
  std::vector<std::vector<size_t>> block_params(blocks_.size());
  for (size_t b = 0; b < blocks_.size(); ++b) {
    for (size_t i : blocks_[b].params) {
      if (params_[i].managed >= 0) {
        block_params[b].push_back(static_cast<size_t>(params_[i].managed));
      }
    }
  }
  CoordinatorConfig cc = coordinator_config(config_);
  // Micro-batches follow each other with the same parameters until step() or
  // refresh_from_master(), which release everything first.
  cc.keep_across_passes = true;
  coordinator_ = std::make_unique<ParamCoordinator>(
      cc, std::move(numels_managed), std::move(block_params), std::move(persistent), *store_);
  store_->set_callbacks([this](size_t m, void* data) { bind(params_[managed_[m]], data); },
                        [this](size_t m) { unbind(params_[managed_[m]]); });
}

// Where each gradient goes: the reducer (told how many contributions a parameter used in
// several places gets), the tied router, and a hook on each parameter used outside the blocks.
void ZeroModel::route_gradients() {
  reducer_ =
      std::make_unique<GradReducer>(*layout_, config_, comm_, dtype_, *optimizer_, accelerator_);
  outside_grad_seen_.assign(params_.size(), false);
  std::vector<TiedGradRouter::Tied> tied;
  for (size_t i : trainable_) {
    if (params_[i].tied_outside) {
      tied.push_back({i, params_[i].var, params_[i].numel * dtype_size(dtype_)});
    }
  }
  tied_router_ = std::make_unique<TiedGradRouter>(std::move(tied),
                                                  [this](size_t i, const torch::Tensor& grad) {
                                                    outside_grad_seen_[i] = true;
                                                    add_grad(i, grad);
                                                  });
  for (size_t i : trainable_) {
    Param& p = params_[i];
    const int contributions = static_cast<int>(p.blocks.size()) + (p.outside_use ? 1 : 0);
    if (contributions > 1) {
      reducer_->set_contributions(static_cast<size_t>(p.layout_index), contributions);
    }
    if (p.outside_use) {
      outside_params_.push_back(i);
      p.var.register_hook([this, i](const torch::Tensor& grad) {
        if (!in_micro_batch_) {
          return;
        }
        if (tied_router_->routed(i)) {
          // Every use was taken before autograd's sum: nothing should arrive here.
          if (grad.defined()) {
            throw ZeroError(fmt::format(
                "parameter \"{}\": a gradient reached it past the routes of its tied uses",
                params_[i].name));
          }
          return;
        }
        outside_grad_seen_[i] = true;
        add_grad(i, grad);
      });
    }
  }
}

void ZeroModel::bind(Param& param, void* data) {
  torch::NoGradGuard no_grad;
  param.var.set_data(device_tensor(accelerator_, data, param.shape, dtype_));
}

void ZeroModel::unbind(Param& param) {
  torch::NoGradGuard no_grad;
  param.var.set_data(torch::empty({0}, torch::TensorOptions().dtype(scalar_type(dtype_))));
}

// ---- training ------------------------------------------------------------------------------

void ZeroModel::begin_micro_batch(int micro_batch) {
  if (in_micro_batch_ || in_eval_) {
    throw ZeroError("begin_micro_batch() while a micro-batch or an evaluation is running");
  }
  reducer_->begin_micro_batch(micro_batch);
  std::fill(outside_grad_seen_.begin(), outside_grad_seen_.end(), false);
  if (coordinator_) {
    coordinator_->begin_pass(true);
  }
  in_micro_batch_ = true;
}

void ZeroModel::backward(const torch::Tensor& root) {
  if (!in_micro_batch_) {
    throw ZeroError("backward() outside begin_micro_batch()/end_micro_batch()");
  }
  tied_router_->route(root);
  root.backward();
}

void ZeroModel::end_micro_batch() {
  if (!in_micro_batch_) {
    throw ZeroError("end_micro_batch() without begin_micro_batch()");
  }
  tied_router_->finish();
  // Parameters used outside blocks whose hook did not run (no gradient reached them): a
  // zero contribution keeps every rank's reductions in step.
  for (size_t i : trainable_) {
    Param& p = params_[i];
    if (p.outside_use && !outside_grad_seen_[i]) {
      add_grad(i, torch::Tensor());
    }
    if (p.outside_use && p.var.grad().defined()) {
      p.var.mutable_grad().reset();
    }
  }
  in_micro_batch_ = false;
  reducer_->end_micro_batch();
  if (coordinator_) {
    coordinator_->end_pass();
  }
}

void ZeroModel::begin_eval() {
  if (in_micro_batch_ || in_eval_) {
    throw ZeroError("begin_eval() while a micro-batch or an evaluation is running");
  }
  if (coordinator_) {
    coordinator_->begin_pass(false);
  }
  in_eval_ = true;
}

void ZeroModel::end_eval() {
  if (!in_eval_) {
    throw ZeroError("end_eval() without begin_eval()");
  }
  in_eval_ = false;
  if (coordinator_) {
    coordinator_->end_pass();
  }
}

void ZeroModel::enter_block(size_t block) {
  if (!in_micro_batch_ && !in_eval_) {
    throw ZeroError(
        "a ZeroBlock ran outside begin_micro_batch()/end_micro_batch() or "
        "begin_eval()/end_eval()");
  }
  if (coordinator_) {
    coordinator_->enter(block);
  }
  // In a backward, the parameters used outside blocks whose gradient the hook has handed to
  // the reducer already (an untied output head's, before the first block's backward) need no
  // `.grad`, where autograd put it after the hook: dropping it here frees that tensor (a
  // [vocab, hidden] one for a head) for the rest of the backward, not at end_micro_batch().
  for (size_t i : outside_params_) {
    if (outside_grad_seen_[i] && params_[i].var.grad().defined()) {
      params_[i].var.mutable_grad().reset();
    }
  }
}

void ZeroModel::leave_block(size_t block) {
  if (coordinator_) {
    coordinator_->leave(block);
  }
}

const std::vector<torch::Tensor>& ZeroModel::block_tensors(size_t block) const {
  return blocks_.at(block).tensors;
}

void ZeroModel::block_grads(size_t block, const std::vector<torch::Tensor>& grads) {
  const Block& b = blocks_.at(block);
  if (grads.size() != b.params.size()) {
    throw ZeroError(fmt::format("block {}: {} gradients for {} parameters", block, grads.size(),
                                b.params.size()));
  }
  for (size_t k = 0; k < b.params.size(); ++k) {
    if (params_[b.params[k]].trainable) {
      add_grad(b.params[k], grads[k]);
    }
  }
}

void ZeroModel::add_grad(size_t param_index, const torch::Tensor& grad) {
  const Param& p = params_[param_index];
  torch::Tensor g;  // undefined: a zero contribution
  if (grad.defined()) {
    g = grad.to(scalar_type(dtype_));
    if (static_cast<uint64_t>(g.numel()) != p.numel) {
      throw ZeroError(fmt::format("parameter \"{}\": a gradient of {} elements for {}", p.name,
                                  g.numel(), p.numel));
    }
  }
  // The gradient stays on the device: the reducer copies it into device buckets, and host
  // code sees only the reduced slices this rank owns.
  reducer_->add(static_cast<size_t>(p.layout_index), g);
}

// The step: release the gathered parameters, update the sub-groups (each updated piece
// written to where its parameter lives), gather the resident parameters afresh.
OptimizerStepOutcome ZeroModel::step(int64_t step, double loss_scale) {
  if (in_micro_batch_ || in_eval_) {
    throw ZeroError("step() inside a micro-batch or an evaluation");
  }
  if (coordinator_) {
    coordinator_->release_all();  // the slices are about to change
  }
  const OptimizerStepOutcome outcome = update_sub_groups(step, loss_scale);
  if (!outcome.skipped) {
    gather_resident();
  }
  return outcome;
}

// The slices' write-backs go out together (one write batch) and run on behind the next
// forward; the previous step's batch is waited for first (its failure fails this step).
OptimizerStepOutcome ZeroModel::update_sub_groups(int64_t step, double loss_scale) {
  const offload::ParamCopySink sink = [this](uint64_t offset, const void* data, uint64_t numel) {
    write_updated(offset, data, numel);
  };
  if (!store_) {
    return optimizer_->step(step, loss_scale, sink);
  }
  store_->end_write_batch();
  store_->begin_write_batch();
  OptimizerStepOutcome outcome;
  try {
    outcome = optimizer_->step(step, loss_scale, sink);
  } catch (...) {
    // Store the updated values handed over so far, as a write of each piece would have; the
    // step's own error is the one to report.
    try {
      store_->flush_writes();
    } catch (...) {
    }
    try {
      store_->end_write_batch();
    } catch (...) {
    }
    throw;
  }
  store_->flush_writes();  // slices the step handed over in part (none in a full step)
  store_->close_write_batch();
  return outcome;
}

void ZeroModel::flush_io() {
  if (store_) {
    store_->end_write_batch();
  }
  optimizer_->swapper().flush();
}

void ZeroModel::write_updated(uint64_t offset, const void* data, uint64_t numel) {
  const size_t element = dtype_size(dtype_);
  const auto* src = static_cast<const std::byte*>(data);
  const uint64_t own = config_.stage == 0 ? 0 : static_cast<uint64_t>(comm_.rank());
  bool copied = false;
  layout_->for_each_overlap(
      offset, numel,
      [&](size_t lp, uint64_t slice_offset, uint64_t partition_offset, uint64_t count) {
        Param& p = params_[trainable_[lp]];
        const std::byte* piece = src + (partition_offset - offset) * element;
        if (p.managed >= 0) {
          store_->write_slice(static_cast<size_t>(p.managed), slice_offset, piece, count);
          return;
        }
        const uint64_t slice = layout_->slice(lp).slice_numel;
        auto* dst =
            static_cast<std::byte*>(p.storage.data()) + (own * slice + slice_offset) * element;
        accelerator_.copy_to_device(dst, piece, count * element, *copy_stream_);
        copied = true;
      });
  if (copied) {
    copy_stream_->synchronize();  // `data` is valid only during this call
  }
}

void ZeroModel::gather_resident() {
  if (layout_->world_size() == 1) {
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t element = dtype_size(dtype_);
  std::vector<WorkPtr> works;
  for (size_t lp = 0; lp < trainable_.size(); ++lp) {
    Param& p = params_[trainable_[lp]];
    if (p.managed >= 0) {
      continue;
    }
    const uint64_t slice = layout_->slice(lp).slice_numel;
    auto* base = static_cast<std::byte*>(p.storage.data());
    works.push_back(comm_.all_gather(base + static_cast<uint64_t>(comm_.rank()) * slice * element,
                                     base, slice, dtype_));
  }
  for (WorkPtr& work : works) {
    work->wait();
  }
  allgather_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- introspection ------------------------------------------------------------------------

std::vector<torch::Tensor> ZeroModel::gather_master() {
  // This rank's fp32 slices, read sub-group by sub-group.
  std::vector<std::vector<float>> slices(trainable_.size());
  for (size_t lp = 0; lp < trainable_.size(); ++lp) {
    slices[lp].resize(layout_->slice(lp).slice_numel);
  }
  std::vector<float> buffer;
  const auto& groups = layout_->sub_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    buffer.resize(groups[g].numel);
    optimizer_->swapper().read_sub_group(offload::OptimizerState::kParams, g, buffer.data());
    layout_->for_each_overlap(
        groups[g].offset, groups[g].numel,
        [&](size_t lp, uint64_t slice_offset, uint64_t partition_offset, uint64_t count) {
          std::memcpy(slices[lp].data() + slice_offset,
                      buffer.data() + (partition_offset - groups[g].offset), count * sizeof(float));
        });
  }
  std::vector<torch::Tensor> result(params_.size());
  const int world = layout_->world_size();
  for (size_t lp = 0; lp < trainable_.size(); ++lp) {
    const Param& p = params_[trainable_[lp]];
    const uint64_t slice = layout_->slice(lp).slice_numel;
    torch::Tensor full = torch::empty({static_cast<int64_t>(slice * static_cast<uint64_t>(world))},
                                      torch::TensorOptions().dtype(at::kFloat));
    if (world == 1) {
      std::memcpy(full.data_ptr<float>(), slices[lp].data(), slice * sizeof(float));
    } else {
      host_all_gather(comm_, accelerator_, slices[lp].data(), full.data_ptr<float>(), slice,
                      DType::kFloat32);
    }
    result[trainable_[lp]] = full.narrow(0, 0, static_cast<int64_t>(p.numel)).view(p.shape);
  }
  return result;
}

void ZeroModel::refresh_from_master() {
  if (in_micro_batch_ || in_eval_) {
    throw ZeroError("refresh_from_master() inside a micro-batch or an evaluation");
  }
  if (coordinator_) {
    coordinator_->release_all();  // the slices are about to change
  }
  const size_t element = dtype_size(dtype_);
  std::vector<float> master;
  std::vector<std::byte> copy;
  const auto& groups = layout_->sub_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    master.resize(groups[g].numel);
    copy.resize(groups[g].numel * element);
    optimizer_->swapper().read_sub_group(offload::OptimizerState::kParams, g, master.data());
    from_float(master.data(), copy.data(), dtype_, groups[g].numel);
    write_updated(groups[g].offset, copy.data(), groups[g].numel);
  }
  gather_resident();
}

ZeroModelStats ZeroModel::stats() const {
  ZeroModelStats s;
  if (coordinator_) {
    s.coordinator = coordinator_->stats();
  }
  if (store_) {
    s.params = store_->stats();
    s.host_bytes += store_->host_bytes();
    s.pinned_bytes += store_->pinned_bytes();
  }
  s.reducer = reducer_->stats();
  if (param_swapper_) {
    s.param_swap = param_swapper_->counters();
    s.param_nvme = param_nvme_->stats();
    s.pinned_bytes += param_swapper_->pinned_bytes();
  }
  s.optimizer_swap = optimizer_->swapper().counters();
  s.overlap = optimizer_->overlap_stats();
  s.pinned_bytes += optimizer_->pinned_bytes();
  s.pinned_bytes += reducer_->pinned_bytes();
  s.pinned_bytes += tied_router_->pinned_bytes();
  s.tied = tied_router_->stats();
  if (config_.offload_optimizer != OffloadTarget::kNvme) {
    s.host_bytes += layout_->partition_numel() * 4 * optimizer_->swapper().states_per_param();
    if (config_.overlap_optimizer) {  // the undo arrays of the params and states
      s.host_bytes +=
          layout_->partition_numel() * 4 * (optimizer_->swapper().states_per_param() - 1);
    }
  } else if (optimizer_->swapper().config().grads_in_memory) {  // zinf.grad_offload "cpu"
    s.host_bytes += layout_->partition_numel() * 4;
  }
  if (activation_offload_) {
    s.activations = activation_offload_->stats();
    s.pinned_bytes += s.activations.pinned_bytes;
  }
  for (const offload::NvmeStore* store :
       {param_nvme_.get(), optimizer_nvme_.get(), activation_nvme_.get()}) {
    if (store != nullptr) {
      s.nvme_bytes += store->stats().file_bytes;
    }
  }
  for (const Param& p : params_) {
    s.resident_bytes += p.storage.size();
  }
  s.device = accelerator_.memory_stats();
  s.gathered_high_water_elements = s.coordinator.gathered_high_water;
  s.gathered_high_water_bytes = s.gathered_high_water_elements * dtype_size(dtype_);
  s.allgather_seconds = allgather_seconds_;
  return s;
}

}  // namespace zinf::zero
