// Common interface of zinf's CPU optimizers: one step of an element-wise update rule over
// raw arrays (the fp32 master weights of one sub-group, its gradients and its optimizer
// states), in a single pass over memory.
//
// The offload tier calls `step()` once per sub-group with pointers into its pinned buffers.
// Each element is read once (param, grad, states) and written once (param, states and,
// optionally, a 16-bit copy of the param for the next forward), vectorised with the widest
// SIMD unit present (see simd_level.h) and split over TBB threads in fixed tiles. The
// update is element-wise and every element goes through the same instructions, so results
// are bit-identical for any thread count, tiling, pointer alignment and array length.
//
// Threads: a step runs in the calling thread's TBB arena (limit it with tbb::task_arena or
// tbb::global_control). The optimizer objects are thread-safe: `step()` may be called
// concurrently for disjoint arrays (e.g. pipelined sub-groups of one parameter group);
// `set_config()`/`set_lr()` may be called at any time and take effect at the next step.
//
// Errors: invalid arguments (null pointers, unsupported dtypes, hyper-parameters out of
// range, step < 1) throw std::invalid_argument whose message names the parameter, before
// any memory is touched. Nothing in this layer asserts a runtime condition or exits; a
// non-finite gradient is not an error but is counted and returned in StepResult.
//
// This library never includes LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf::optimizer_cpu {

// Element type of an array handed to an optimizer.
enum class DType : std::uint8_t {
  kFloat32,   // IEEE binary32
  kBFloat16,  // bfloat16 (upper half of a binary32), stored as uint16_t
  kFloat16,   // IEEE binary16, stored as uint16_t
};

// "fp32", "bf16" or "fp16".
[[nodiscard]] std::string_view to_string(DType dtype) noexcept;

// Size of one element in bytes (4 or 2).
[[nodiscard]] std::size_t dtype_size(DType dtype) noexcept;

// The arrays and per-call inputs of one step over one sub-group. All arrays hold `numel`
// elements and must not overlap each other; they need no alignment beyond their element
// type's own (4 bytes for fp32, 2 for 16-bit), though 64-byte aligned arrays stream best.
struct StepArgs {
  // fp32 master weights [numel], updated in place.
  float* params = nullptr;
  // Gradients [numel] of type `grad_dtype` (fp32, bf16 or fp16); read only.
  const void* grads = nullptr;
  DType grad_dtype = DType::kFloat32;
  // First moment [numel] of type `state_dtype`: Adam's m, Lion's momentum. Unused by Adagrad
  // (may be null there). Initialise to zero before step 1.
  void* exp_avg = nullptr;
  // Second moment [numel] of type `state_dtype`: Adam's v, Adagrad's sum of squares
  // (initialise to `initial_accumulator_value`, usually zero). Unused by Lion.
  void* exp_avg_sq = nullptr;
  // fp32 (default, exact optimizer semantics) or bf16 (half the state traffic; states are
  // rounded to nearest-even after each update).
  DType state_dtype = DType::kFloat32;
  std::size_t numel = 0;

  // Every gradient is multiplied by this before use: 1/loss_scale times the clipping
  // coefficient. Must be finite and > 0.
  float grad_scale = 1.0f;

  // Optional 16-bit copy of the updated params [numel], written in the same pass
  // (round-to-nearest-even; NaN stays NaN). Null: no copy. Dtype bf16 or fp16.
  void* param_copy = nullptr;
  DType param_copy_dtype = DType::kBFloat16;

  // 1-based number of this step of the parameter group (the caller owns the counter; pass
  // the same number for every sub-group of one step, and the restored number after a
  // checkpoint resume). Drives bias correction (Adam) and lr decay (Adagrad).
  std::int64_t step = 1;

  // false (default): single pass; non-finite (scaled) gradients are counted and the update
  //   is applied anyway (NaN/Inf then reach the params of those elements). Use it when the
  //   overflow check already ran, e.g. with the global grad norm.
  // true: the gradients are scanned first (one extra read of them); if any is non-finite,
  //   nothing is written and StepResult::skipped is set.
  bool skip_if_nonfinite = false;
};

// Outcome of one step.
struct [[nodiscard]] StepResult {
  // Gradients that were NaN or +-Inf after scaling by grad_scale.
  std::uint64_t nonfinite_grads = 0;
  // True when skip_if_nonfinite was set and a non-finite gradient was found: no array was
  // written.
  bool skipped = false;

  [[nodiscard]] bool found_nonfinite() const noexcept { return nonfinite_grads != 0; }
};

// The optimizers of this library (Adam and AdamW are one update rule with two ways of
// applying weight decay).
enum class OptimizerKind : std::uint8_t { kAdam, kAdamW, kAdagrad, kLion };

// DeepSpeed's spelling of each in a config's "optimizer.type": "Adam", "AdamW", "Adagrad",
// "Lion".
[[nodiscard]] constexpr std::string_view to_string(OptimizerKind kind) noexcept {
  switch (kind) {
    case OptimizerKind::kAdam:
      return "Adam";
    case OptimizerKind::kAdamW:
      return "AdamW";
    case OptimizerKind::kAdagrad:
      return "Adagrad";
    case OptimizerKind::kLion:
      return "Lion";
  }
  return "?";
}

// The state arrays an optimizer's step() reads and writes besides params and grads, and their
// names in a torch.optim state_dict (DeepSpeed's checkpoints hold them by these names). Every
// layer that sizes, swaps, plans or saves optimizer states asks this, not the optimizer's name.
struct StateArrays {
  bool exp_avg = false;     // StepArgs::exp_avg: Adam's m, Lion's momentum
  bool exp_avg_sq = false;  // StepArgs::exp_avg_sq: Adam's v, Adagrad's sum of squares
  std::string_view exp_avg_name = "exp_avg";
  std::string_view exp_avg_sq_name = "exp_avg_sq";
  [[nodiscard]] constexpr int count() const noexcept {
    return (exp_avg ? 1 : 0) + (exp_avg_sq ? 1 : 0);
  }
};

[[nodiscard]] constexpr StateArrays state_arrays(OptimizerKind kind) noexcept {
  switch (kind) {
    case OptimizerKind::kAdagrad:
      return {false, true, "exp_avg", "sum"};
    case OptimizerKind::kLion:
      return {true, false, "exp_avg", "exp_avg_sq"};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      break;
  }
  return {true, true, "exp_avg", "exp_avg_sq"};
}

// An element-wise optimizer over raw arrays (Adam/AdamW, Adagrad, Lion).
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Applies one update to `args.numel` elements. On success all of params, the states and
  // the optional copy are updated (unless the result says skipped). Throws
  // std::invalid_argument (nothing written) when an argument is invalid.
  [[nodiscard]] virtual StepResult step(const StepArgs& args) = 0;

  // Current learning rate; set_lr() throws std::invalid_argument("lr ...") if lr < 0 or not
  // finite.
  [[nodiscard]] virtual float lr() const = 0;
  virtual void set_lr(float lr) = 0;
  // Sets the first moment's decay (Adam's beta1) for a schedule that cycles it (DeepSpeed's
  // OneCycle cycles momentum). Returns false, changing nothing, for an optimizer that takes no
  // such schedule (Adagrad, Lion); throws like set_lr for a value out of range.
  virtual bool set_beta1(float beta1) {
    (void)beta1;
    return false;
  }

  // "adam", "adamw", "adagrad" or "lion".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual OptimizerKind kind() const noexcept = 0;
  // The state arrays step() uses.
  [[nodiscard]] StateArrays state_arrays() const noexcept {
    return optimizer_cpu::state_arrays(kind());
  }
};

// Number of NaN/Inf elements in `data` [numel] of type `dtype`, SIMD and TBB parallel.
// Throws std::invalid_argument if data is null while numel > 0.
[[nodiscard]] std::uint64_t count_nonfinite(const void* data, DType dtype, std::size_t numel);

}  // namespace zinf::optimizer_cpu
