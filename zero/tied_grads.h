// TiedGradRouter: the gradient of a parameter that several modules outside the blocks share
// (a tied embedding and output head) leaves the device between its uses.
//
// Autograd sums a leaf's gradient over its uses before the leaf's hooks see it. For a tied
// head that sum waits a whole backward: the head's contribution, computed first, sits in
// autograd's input buffer on the device until the embedding's is computed, last, after every
// block's recomputation and backward, where the device peak is ([vocab, hidden] elements: a
// sixth of the peak of a SmolLM-shaped model at 4096 tokens).
//
// Before the backward starts, route() walks the graph from the loss and puts a post-hook on
// every node with an output going into such a parameter's gradient accumulator. Each hook
// takes that output from autograd (which then has nothing to sum for the parameter) and
//  - all but the last use: adds it to a partial sum parked in a pinned host buffer (the
//    device copy is freed when the node's outputs are);
//  - the last use: brings the partial sum back, adds the contribution and delivers the whole
//    gradient. Autograd's input buffer adds each arriving contribution to the sum it holds,
//    so this is the same sum in the same order: the same gradient, bit for bit.
// A use whose node never ran (no gradient reached it) leaves a partial sum that finish()
// delivers at the end of the micro-batch. When every use ran without a gradient the delivery
// is an undefined tensor (a zero contribution); when no use ran at all nothing is delivered,
// and the owner adds its zero contribution as for any parameter no gradient reached.
// A second backward over a retained graph finds the hooks of a finished route passing
// autograd's gradients through unchanged.
//
// Only parameters with two or more names outside the blocks are routed (so the pinned bytes
// are known before training: MemoryPlan counts one gradient of each), and only when the
// graph has two or more edges into their accumulator.
//
// Thread safety: route() and finish() are called by the thread that runs the backward; the
// hooks run on autograd's thread for the device (on CUDA a worker of its own) while that
// thread waits in backward(), so no two of them run at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/footprint.h"

namespace zinf::zero {

struct TiedGradStats {
  uint64_t parked = 0;        // contributions parked in pinned memory
  uint64_t parked_bytes = 0;  // their bytes
  uint64_t delivered = 0;     // whole gradients delivered
};

class TiedGradRouter {
 public:
  // The gradient of parameter `param` (the owner's index), summed over its uses; undefined
  // when none of its routed uses produced one.
  using Deliver = std::function<void(size_t param, const at::Tensor& grad)>;

  struct Tied {
    size_t param = 0;    // the owner's index, handed back to Deliver
    at::Tensor var;      // the leaf autograd accumulates into
    uint64_t bytes = 0;  // one gradient's bytes (numel x the gradient's element size)
  };

  // Allocates one pinned buffer of `bytes` per tied parameter (PinnedMemoryLimitError past
  // the process's limit).
  TiedGradRouter(std::vector<Tied> tied, Deliver deliver);
  ~TiedGradRouter();
  // The pinned buffer parking a tied parameter's gradient of `grad_bytes` between its uses.
  [[nodiscard]] static uint64_t pinned_bytes(uint64_t grad_bytes) noexcept {
    return offload::pinned_allocation(grad_bytes);
  }

  TiedGradRouter(const TiedGradRouter&) = delete;
  TiedGradRouter& operator=(const TiedGradRouter&) = delete;

  // Before root.backward(): routes the uses of every tied parameter in root's graph.
  void route(const at::Tensor& root);
  // Whether `param`'s uses are routed in the current backward (its leaf hook then sees no
  // gradient).
  [[nodiscard]] bool routed(size_t param) const noexcept;
  // End of the micro-batch: delivers the partial sums of parameters some of whose uses did
  // not run, and forgets this backward's routes (a retained graph's hooks then do nothing).
  void finish();

  [[nodiscard]] uint64_t pinned_bytes() const noexcept;
  [[nodiscard]] const TiedGradStats& stats() const noexcept { return stats_; }

 private:
  class Hook;
  struct Entry {
    Tied tied;
    aio::PinnedBuffer parked;
    int uses = 0;      // edges routed in this backward (0: not routed)
    int received = 0;  // of them, run so far
    bool has_parked = false;
    std::vector<int64_t> shape;  // of the parked sum
    at::ScalarType dtype = at::kFloat;
    at::Device device = at::kCPU;
  };

  // Whether a hook of route() number `generation` still has a use of `entry` to take.
  [[nodiscard]] bool expects(size_t entry, uint64_t generation) const noexcept;
  void take(size_t entry, const at::Tensor& grad);
  at::Tensor unpark(Entry& e);

  std::vector<Entry> entries_;
  Deliver deliver_;
  uint64_t generation_ = 0;  // bumped by route() and finish(): older hooks are stale
  TiedGradStats stats_;
  // What the hooks reach this router through; they hold it weakly, so a graph that outlives
  // the router finds nothing and leaves autograd's gradients alone.
  std::shared_ptr<TiedGradRouter*> self_;
};

}  // namespace zinf::zero
