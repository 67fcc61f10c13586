#include "zero/tied_grads.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "zero/error.h"

namespace zinf::zero {

// Takes output `output` of the node it is attached to away from autograd, while the router
// (reached through a weak link: a graph may outlive it) still expects that use.
class TiedGradRouter::Hook final : public torch::autograd::FunctionPostHook {
 public:
  Hook(std::weak_ptr<TiedGradRouter*> router, size_t entry, size_t output, uint64_t generation)
      : router_(std::move(router)), entry_(entry), output_(output), generation_(generation) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    const std::shared_ptr<TiedGradRouter*> router = router_.lock();
    if (!router || output_ >= outputs.size() || !(*router)->expects(entry_, generation_)) {
      return outputs;  // a graph kept from an earlier backward, or one run again: autograd's
    }
    torch::autograd::variable_list out = outputs;
    at::Tensor grad = std::move(out[output_]);
    out[output_] = at::Tensor();
    (*router)->take(entry_, grad);
    return out;
  }

 private:
  const std::weak_ptr<TiedGradRouter*> router_;
  const size_t entry_;
  const size_t output_;
  const uint64_t generation_;
};

TiedGradRouter::TiedGradRouter(std::vector<Tied> tied, Deliver deliver)
    : deliver_(std::move(deliver)), self_(std::make_shared<TiedGradRouter*>(this)) {
  entries_.reserve(tied.size());
  for (Tied& t : tied) {
    Entry e;
    e.parked = aio::PinnedBuffer(t.bytes);
    e.tied = std::move(t);
    entries_.push_back(std::move(e));
  }
}

TiedGradRouter::~TiedGradRouter() = default;

void TiedGradRouter::route(const at::Tensor& root) {
  ++generation_;
  for (Entry& e : entries_) {
    e.uses = 0;
    e.received = 0;
    e.has_parked = false;
  }
  if (entries_.empty() || !root.defined() || !root.grad_fn()) {
    return;
  }
  using torch::autograd::Node;
  std::unordered_map<const Node*, size_t> sinks;  // gradient accumulator -> entry
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (std::shared_ptr<Node> acc =
            torch::autograd::impl::try_get_grad_accumulator(entries_[i].tied.var)) {
      sinks.emplace(acc.get(), i);
    }
  }
  if (sinks.empty()) {
    return;
  }
  // Every edge into a sink, found breadth-first from the loss (each node once).
  std::vector<std::vector<std::pair<Node*, size_t>>> edges(entries_.size());
  std::unordered_set<const Node*> seen;
  std::deque<Node*> queue;
  Node* start = root.grad_fn().get();
  seen.insert(start);
  queue.push_back(start);
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (size_t k = 0; k < node->num_outputs(); ++k) {
      const torch::autograd::Edge& edge = node->next_edge(k);
      if (!edge.is_valid()) {
        continue;
      }
      Node* next = edge.function.get();
      if (const auto sink = sinks.find(next); sink != sinks.end()) {
        edges[sink->second].emplace_back(node, k);
      } else if (seen.insert(next).second) {
        queue.push_back(next);
      }
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (edges[i].size() < 2) {
      continue;  // one use: autograd has nothing to hold
    }
    entries_[i].uses = static_cast<int>(edges[i].size());
    for (const auto& [node, output] : edges[i]) {
      node->add_post_hook(std::make_unique<Hook>(self_, i, output, generation_));
    }
  }
}

bool TiedGradRouter::routed(size_t param) const noexcept {
  for (const Entry& e : entries_) {
    if (e.tied.param == param) {
      return e.uses > 0;
    }
  }
  return false;
}

at::Tensor TiedGradRouter::unpark(Entry& e) {
  e.has_parked = false;
  const at::Tensor host =
      at::from_blob(e.parked.data(), e.shape, at::TensorOptions().dtype(e.dtype));
  return at::empty(e.shape, at::TensorOptions().dtype(e.dtype).device(e.device)).copy_(host);
}

bool TiedGradRouter::expects(size_t entry, uint64_t generation) const noexcept {
  return generation == generation_ && entry < entries_.size() &&
         entries_[entry].received < entries_[entry].uses;
}

void TiedGradRouter::take(size_t entry, const at::Tensor& grad) {
  Entry& e = entries_[entry];
  ++e.received;
  // What autograd's input buffer would hold now: the earlier sum plus this contribution.
  at::Tensor sum = grad;
  if (e.has_parked) {
    at::Tensor earlier = unpark(e);
    sum = grad.defined() ? earlier.add_(grad) : earlier;
  }
  if (e.received == e.uses) {
    ++stats_.delivered;
    deliver_(e.tied.param, sum);
    return;
  }
  if (!sum.defined()) {
    return;
  }
  const uint64_t bytes = static_cast<uint64_t>(sum.numel()) * sum.element_size();
  if (bytes > e.parked.size()) {
    throw ZeroError(
        fmt::format("tied gradient: a contribution of {} bytes for a parameter planned at {} bytes",
                    bytes, e.parked.size()));
  }
  e.shape = sum.sizes().vec();
  e.dtype = sum.scalar_type();
  e.device = sum.device();
  at::from_blob(e.parked.data(), e.shape, at::TensorOptions().dtype(e.dtype)).copy_(sum);
  e.has_parked = true;
  ++stats_.parked;
  stats_.parked_bytes += bytes;
}

void TiedGradRouter::finish() {
  for (Entry& e : entries_) {
    if (e.uses > 0 && e.received < e.uses && e.has_parked) {
      ++stats_.delivered;
      deliver_(e.tied.param, unpark(e));
    }
    e.uses = 0;
    e.received = 0;
    e.has_parked = false;
  }
  ++generation_;
}

uint64_t TiedGradRouter::pinned_bytes() const noexcept {
  uint64_t total = 0;
  for (const Entry& e : entries_) {
    total += e.parked.capacity();
  }
  return total;
}

}  // namespace zinf::zero
