#include "engine/config/resolve.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/config/json_reader.h"
#include "engine/config/lr_schedule.h"
#include "offload/cpu_tier_budget.h"

namespace zinf::config {
namespace {

// Records the values resolve_auto() chooses and takes their paths off the "auto" list.
class Resolver {
 public:
  Resolver(RunConfig& config, const AutoContext& context) : c_(config), ctx_(context) {}

  [[nodiscard]] bool pending(const std::string& path) const { return c_.is_auto(path); }

  // `rule` says where the value came from; "auto: " is put before it when the file said
  // "auto" (a value filled in for an absent key has no prefix).
  template <typename T>
  void record(const std::string& path, const T& value, const std::string& rule) {
    const bool was_auto = c_.auto_keys.erase(path) != 0;
    c_.resolved.push_back(
        {path, fmt::format("{}", value), was_auto ? fmt::format("auto: {}", rule) : rule});
  }

  [[noreturn]] void fail(const std::string& path, const std::string& reason) const {
    throw ConfigError(c_.source, path, reason);
  }

  void batch();
  void optimizer_and_scheduler();
  void precision();
  void zero_buckets();
  void offload_defaults();
  void accelerator();

 private:
  RunConfig& c_;
  const AutoContext& ctx_;
};

void Resolver::batch() {
  BatchConfig& b = c_.batch;
  const int64_t world = ctx_.world_size;
  // The command line fills the micro batch and the accumulation when the file leaves them to
  // it ("auto") or says nothing.
  if (!b.micro_batch_per_gpu && ctx_.micro_batch_per_gpu) {
    b.micro_batch_per_gpu = *ctx_.micro_batch_per_gpu;
    record("train_micro_batch_size_per_gpu", *b.micro_batch_per_gpu, "from the command line");
  }
  if (!b.gradient_accumulation_steps && ctx_.gradient_accumulation_steps) {
    b.gradient_accumulation_steps = *ctx_.gradient_accumulation_steps;
    record("gradient_accumulation_steps", *b.gradient_accumulation_steps, "from the command line");
  }

  std::optional<int64_t>&train = b.train_batch_size, &micro = b.micro_batch_per_gpu,
  &accumulation = b.gradient_accumulation_steps;
  // Every batch size "auto" (as the HF Trainer writes them) and none on the command line:
  // the command line's defaults, as the Trainer fills them from its own.
  if (!train && !micro && c_.is_auto("train_micro_batch_size_per_gpu") &&
      ctx_.default_micro_batch_per_gpu) {
    micro = *ctx_.default_micro_batch_per_gpu;
    record("train_micro_batch_size_per_gpu", *micro,
           "the command line's default (--micro-batch sets it)");
    if (!accumulation && ctx_.default_gradient_accumulation_steps) {
      accumulation = *ctx_.default_gradient_accumulation_steps;
      record("gradient_accumulation_steps", *accumulation,
             "the command line's default (--grad-accum sets it)");
    }
  }
  if (!train && !micro) {
    fail("train_micro_batch_size_per_gpu",
         "no batch size: give train_batch_size or train_micro_batch_size_per_gpu (a number, or "
         "\"auto\" with the micro batch on the command line)");
  }
  // DeepSpeed's rules for the missing ones.
  if (train && micro && !accumulation) {
    accumulation = *train / (*micro * world);
    record("gradient_accumulation_steps", *accumulation,
           fmt::format("train_batch_size / (micro x world size) = {} / ({} x {})", *train, *micro,
                       world));
  } else if (train && !micro) {
    if (!accumulation) {
      accumulation = 1;
      record("gradient_accumulation_steps", 1, "1 when only train_batch_size is given");
    }
    micro = *train / (world * *accumulation);
    record("train_micro_batch_size_per_gpu", *micro,
           fmt::format("train_batch_size / (world size x accumulation) = {} / ({} x {})", *train,
                       world, *accumulation));
  } else if (!train) {
    if (!accumulation) {
      accumulation = 1;
      record("gradient_accumulation_steps", 1, "1 when only the micro batch is given");
    }
    train = *micro * *accumulation * world;
    record("train_batch_size", *train,
           fmt::format("micro x accumulation x world size = {} x {} x {}", *micro, *accumulation,
                       world));
  }
  if (*micro < 1 || *accumulation < 1 || *train != *micro * *accumulation * world) {
    fail("train_batch_size",
         fmt::format("batch sizes disagree: train_batch_size {} != "
                     "train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x "
                     "world size {} (= {})",
                     *train, *micro, *accumulation, world, *micro * *accumulation * world));
  }
  c_.zero.gradient_accumulation_steps = static_cast<int>(*accumulation);
}

void Resolver::optimizer_and_scheduler() {
  if (pending("gradient_clipping")) {
    c_.zero.gradient_clipping = ctx_.max_grad_norm.value_or(1.0);
    record("gradient_clipping", c_.zero.gradient_clipping,
           ctx_.max_grad_norm ? "from the command line" : "1.0, the HF Trainer's default");
  }
  OptimizerConfig& o = c_.optimizer;
  if (pending("optimizer.params.lr")) {
    o.lr = ctx_.lr.value_or(5e-5);
    record("optimizer.params.lr", o.lr, ctx_.lr ? "from the command line" : "5e-5, HF's default");
  }
  if (pending("optimizer.params.betas")) {
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    record("optimizer.params.betas", "[0.9, 0.999]", "HF's default");
  }
  if (pending("optimizer.params.eps")) {
    o.eps = 1e-8;
    record("optimizer.params.eps", o.eps, "HF's default");
  }
  if (pending("optimizer.params.weight_decay")) {
    o.weight_decay = 0.0;
    record("optimizer.params.weight_decay", o.weight_decay, "HF's default");
  }

  SchedulerConfig& s = c_.scheduler;
  const bool scheduler_auto =
      std::any_of(c_.auto_keys.begin(), c_.auto_keys.end(),
                  [](const std::string& key) { return key.rfind("scheduler.", 0) == 0; });
  if (pending("scheduler.params.warmup_min_lr")) {
    s.warmup_min_lr = 0.0;
    record("scheduler.params.warmup_min_lr", s.warmup_min_lr, "0");
  }
  if (pending("scheduler.params.warmup_max_lr")) {
    s.warmup_max_lr = o.lr;
    record("scheduler.params.warmup_max_lr", o.lr, "the optimizer's lr");
  }
  if (pending("scheduler.params.warmup_num_steps")) {
    s.warmup_num_steps = ctx_.warmup_steps.value_or(0);
    record("scheduler.params.warmup_num_steps", s.warmup_num_steps,
           ctx_.warmup_steps ? "from the command line" : "0, HF's default");
  }
  if (pending("scheduler.params.total_num_steps")) {
    if (!ctx_.total_steps) {
      fail("scheduler.params.total_num_steps",
           "\"auto\" needs the run's number of steps, and none was given (--steps)");
    }
    s.total_num_steps = *ctx_.total_steps;
    record("scheduler.params.total_num_steps", s.total_num_steps, "the run's number of steps");
  }
  check_scheduler(s, c_.source);
  // parse_config gave the warning when no scheduler value was "auto".
  if (std::optional<std::string> warning = scheduler_warning(s); warning && scheduler_auto) {
    c_.warnings.push_back(
        fmt::format("{}: scheduler.params.total_num_steps: {}", c_.source, *warning));
  }
}

void Resolver::precision() {
  const bool fp16 = ctx_.precision == zero::Precision::kFloat16;
  const bool bf16 = ctx_.precision == zero::Precision::kBFloat16;
  if (pending("fp16.enabled")) {
    c_.precision.fp16_enabled = fp16;
    record("fp16.enabled", fp16, fp16 ? "fp16 asked for" : "fp16 not asked for");
  }
  if (pending("bf16.enabled")) {
    c_.precision.bf16_enabled = bf16;
    record("bf16.enabled", bf16, bf16 ? "bf16 asked for" : "bf16 not asked for");
  }
  if (pending("amp.enabled")) {
    record("amp.enabled", false, "zinf has no apex AMP; fp16 / bf16 choose the precision");
  }
  detail::apply_precision(c_);
}

void Resolver::zero_buckets() {
  zero::ZeroConfig& z = c_.zero;
  const std::optional<int64_t> h = ctx_.hidden_size;
  const auto hh = h ? static_cast<uint64_t>(*h) * static_cast<uint64_t>(*h) : 0;
  if (pending("zero_optimization.reduce_bucket_size")) {
    if (h) z.reduce_bucket_size = hh;
    record("zero_optimization.reduce_bucket_size", z.reduce_bucket_size,
           h ? fmt::format("hidden^2 = {}^2", *h) : "DeepSpeed's default; hidden size unknown");
  }
  if (pending("zero_optimization.stage3_prefetch_bucket_size")) {
    if (h) z.prefetch_bucket_size = static_cast<uint64_t>(0.9 * static_cast<double>(hh));
    record("zero_optimization.stage3_prefetch_bucket_size", z.prefetch_bucket_size,
           h ? fmt::format("0.9 x hidden^2 = 0.9 x {}^2", *h)
             : "DeepSpeed's default; hidden size unknown");
  }
  if (pending("zero_optimization.stage3_param_persistence_threshold")) {
    if (h) z.param_persistence_threshold = 10 * static_cast<uint64_t>(*h);
    record(
        "zero_optimization.stage3_param_persistence_threshold", z.param_persistence_threshold,
        h ? fmt::format("10 x hidden = 10 x {}", *h) : "DeepSpeed's default; hidden size unknown");
  }
}

void Resolver::accelerator() {
  if (c_.zinf.accelerator != AcceleratorType::kAuto) return;
  c_.zinf.accelerator = ctx_.cuda_available ? AcceleratorType::kCuda : AcceleratorType::kCpu;
  c_.auto_keys.insert("zinf.accelerator.type");  // so that record() says "auto"
  record("zinf.accelerator.type", to_string(c_.zinf.accelerator),
         ctx_.cuda_available                    ? "a CUDA device is usable"
         : ctx_.cuda_unavailable_reason.empty() ? "no usable CUDA device"
                                                : ctx_.cuda_unavailable_reason);
}

// zinf's keys whose defaults depend on the optimizer's tier: said at start-up, since they
// cost disk and host memory (the engine may still turn them off where that is short, saying
// so: engine::fit_defaults).
void Resolver::offload_defaults() {
  if (c_.zero.offload_optimizer != zero::OffloadTarget::kNvme) return;
  if (!c_.zinf.overlap_optimizer) {
    record("zinf.overlap_optimizer", c_.zero.overlap_optimizer,
           "the default with the optimizer on NVMe: sub-groups updated behind the backward");
  }
  if (!c_.zinf.grad_offload) {
    record("zinf.grad_offload", c_.zero.host_grads ? "cpu" : "nvme",
           "the default with the optimizer on NVMe: its fp32 grads in host memory");
  }
}

// The key a swap folder came from, for messages (a RunConfig made by hand may lack them).
std::string nvme_path_key(const RunConfig& c, size_t index) {
  return index < c.nvme_path_keys.size() ? c.nvme_path_keys[index]
                                         : fmt::format("zero.nvme_paths[{}]", index);
}

}  // namespace

void resolve_auto(RunConfig& config, const AutoContext& context) {
  if (context.world_size < 1) {
    throw ConfigError(config.source, "",
                      fmt::format("world size must be at least 1, got {}", context.world_size));
  }
  Resolver r(config, context);
  r.batch();
  r.optimizer_and_scheduler();
  r.precision();
  r.zero_buckets();
  r.offload_defaults();
  r.accelerator();
  if (!config.auto_keys.empty()) {
    throw ConfigError(config.source, *config.auto_keys.begin(),
                      "\"auto\" is not resolved by zinf for this key; write a value");
  }
  if (context.check_paths) check_nvme_paths(config);
  if (!context.param_numels.empty()) {
    validate_with_model(config, context.param_numels, context.world_size);
  }
}

std::vector<std::string> resolved_lines(const RunConfig& config) {
  std::vector<std::string> lines;
  lines.reserve(config.resolved.size());
  for (const ResolvedValue& v : config.resolved) {
    lines.push_back(fmt::format("{} = {} ({})", v.path, v.value, v.rule));
  }
  return lines;
}

namespace {

// The name of the virtual file system `dir` is on (procfs, sysfs, ...), or nullptr.
const char* virtual_file_system(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return nullptr;
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0x9fa0:  // PROC_SUPER_MAGIC
      return "procfs";
    case 0x62656572:  // SYSFS_MAGIC
      return "sysfs";
    case 0x1cd1:  // DEVPTS_SUPER_MAGIC
      return "devpts";
    case 0x27e0eb:    // CGROUP_SUPER_MAGIC
    case 0x63677270:  // CGROUP2_SUPER_MAGIC
      return "cgroupfs";
    case 0x64626720:  // DEBUGFS_MAGIC
      return "debugfs";
    case 0x74726163:  // TRACEFS_MAGIC
      return "tracefs";
    case 0x73636673:  // SECURITYFS_MAGIC
      return "securityfs";
    case 0xcafe4a11:  // BPF_FS_MAGIC
      return "bpffs";
    default:
      return nullptr;
  }
}

}  // namespace

void check_nvme_paths(const RunConfig& config) {
  for (size_t i = 0; i < config.zero.nvme_paths.size(); ++i) {
    const std::string& dir = config.zero.nvme_paths[i];
    auto fail = [&](const std::string& why) {
      throw ConfigError(config.source, nvme_path_key(config, i), fmt::format("{}: {}", dir, why));
    };
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      fail(errno == ENOENT ? std::string("does not exist")
                           : fmt::format("cannot be read: {}", std::strerror(errno)));
    }
    if (!S_ISDIR(st.st_mode)) fail("is not a directory");
    // zinf.nvme_paths stripes each tier over its folders: one folder twice (also under
    // another name) would put two stripes in one place. (The two tiers' own nvme_path may
    // name one folder: each keeps its own file.)
    for (size_t j = 0; !config.zinf.nvme_paths.empty() && j < i; ++j) {
      struct stat other {};
      if (::stat(config.zero.nvme_paths[j].c_str(), &other) == 0 && other.st_dev == st.st_dev &&
          other.st_ino == st.st_ino) {
        fail(fmt::format("is the folder {} already lists ({}): give each folder once",
                         nvme_path_key(config, j), config.zero.nvme_paths[j]));
      }
    }
    if (const char* fs = virtual_file_system(dir)) {
      fail(
          fmt::format("is on {}, a virtual file system that holds no files: give a folder on "
                      "a disk",
                      fs));
    }
    // Permission bits do not tell (root, read-only mounts, ACLs): create a file and remove it.
    std::string probe = dir + "/.zinf_write_probe.XXXXXX";
    const int fd = ::mkstemp(probe.data());
    if (fd < 0) {
      const int err = errno;
      fail(err == EACCES || err == EROFS || err == EPERM
               ? fmt::format("is not writable: {}", std::strerror(err))
               : fmt::format("cannot hold a new file: creating one there fails: {}",
                             std::strerror(err)));
    }
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

void validate_with_model(const RunConfig& config, const std::vector<uint64_t>& param_numels,
                         int world_size) {
  const zero::ZeroConfig& z = config.zero;
  if (z.offload_param != zero::OffloadTarget::kNvme || world_size < 1) return;
  const auto world = static_cast<uint64_t>(world_size);
  offload::CpuTierBudget cpu_tier(z.param_max_in_cpu);
  uint64_t largest = 0;  // the largest partition that goes to NVMe
  for (uint64_t numel : param_numels) {
    const uint64_t slice = (numel + world - 1) / world;
    if (cpu_tier.place(slice)) {
      continue;  // kept in CPU memory (offload_param.max_in_cpu)
    }
    largest = std::max(largest, slice);
  }
  const uint64_t needed = (largest + z.param_buffer_size - 1) / z.param_buffer_size;
  if (needed <= z.param_buffer_count) return;
  throw ConfigError(
      config.source, "zero_optimization.offload_param.buffer_count",
      fmt::format("{} buffers of {} elements (buffer_size) cannot hold the largest parameter "
                  "partition on nvme, {} elements, which is read into {} buffers at once; set "
                  "buffer_count to at least {}, or buffer_size to at least {}",
                  z.param_buffer_count, z.param_buffer_size, largest, needed, needed,
                  (largest + z.param_buffer_count - 1) / z.param_buffer_count));
}

}  // namespace zinf::config
