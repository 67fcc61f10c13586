// SingleCommunicator: the Communicator of a world of one process, with no rendezvous and no
// threads. Every collective completes before it returns (its Work is already complete):
// all_gather and reduce_scatter copy send to recv when they differ (and do nothing in
// place), all_reduce and broadcast leave the data as it is, barrier returns at once.
// Buffers may be anywhere the CPU can read (host memory, the CPU accelerator's memory).
// Arguments are checked as on every backend (detail::check_*).
//
// Thread safety: stateless after construction; every method may be called from any thread.
#pragma once

#include <chrono>
#include <string_view>

#include "zero/comm/communicator.h"

namespace zinf::zero {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : timeout_(timeout) {}

  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int world_size() const noexcept override { return 1; }
  [[nodiscard]] std::string_view backend() const noexcept override { return "single"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

  [[nodiscard]] WorkPtr all_gather(const void* send, void* recv, size_t count,
                                   DType dtype) override;
  [[nodiscard]] WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                       ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr all_reduce(void* data, size_t count, DType dtype,
                                   ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override;
  [[nodiscard]] WorkPtr barrier() override;

 private:
  const std::chrono::milliseconds timeout_;
};

}  // namespace zinf::zero
