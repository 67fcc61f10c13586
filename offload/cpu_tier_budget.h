// offload_param.max_in_cpu, the one rule: parameter partitions are placed in the order they
// are added; one stays in CPU memory when it fits in what is left of max_in_cpu elements,
// otherwise it goes to NVMe (a later, smaller one may still fit); a partition is never split
// between the tiers. ParamSwapper places with it, the memory plan and the config's buffer
// check count with it.
//
// Thread safety: none (a plain value).
#pragma once

#include <cstdint>

namespace zinf::offload {

class CpuTierBudget {
 public:
  explicit CpuTierBudget(uint64_t max_in_cpu) noexcept : max_(max_in_cpu), left_(max_in_cpu) {}

  // Whether a partition of `numel` elements, added next, stays in CPU memory.
  [[nodiscard]] bool fits(uint64_t numel) const noexcept { return numel <= left_; }
  // Records that it does (call once it is there: a failed placement takes nothing).
  void take(uint64_t numel) noexcept { left_ -= numel; }
  // fits() and, when it does, take().
  bool place(uint64_t numel) noexcept {
    if (!fits(numel)) return false;
    take(numel);
    return true;
  }
  // Elements placed in CPU memory so far.
  [[nodiscard]] uint64_t used() const noexcept { return max_ - left_; }

 private:
  uint64_t max_;
  uint64_t left_;
};

}  // namespace zinf::offload
