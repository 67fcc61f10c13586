#include "zero/comm/strict_communicator.h"

#include <fmt/format.h>

#include <utility>

namespace zinf::zero {
namespace {

class StrictCommunicator final : public Communicator {
 public:
  StrictCommunicator(std::unique_ptr<Communicator> inner, DeviceMemoryMap map)
      : inner_(std::move(inner)), map_(std::move(map)) {}

  int rank() const noexcept override { return inner_->rank(); }
  int world_size() const noexcept override { return inner_->world_size(); }
  std::string_view backend() const noexcept override { return inner_->backend(); }
  std::chrono::milliseconds timeout() const noexcept override { return inner_->timeout(); }

  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    void* r = device(recv, bytes * static_cast<size_t>(world_size()), "all_gather", "receive");
    const void* s = device(send, bytes, "all_gather", "send");
    return inner_->all_gather(s, r, count, dtype);
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                         ReduceOp op) override {
    const size_t bytes = count * dtype_size(dtype);
    const void* s =
        device(send, bytes * static_cast<size_t>(world_size()), "reduce_scatter", "send");
    void* r = device(recv, bytes, "reduce_scatter", "receive");
    return inner_->reduce_scatter(s, r, count, dtype, op);
  }
  WorkPtr all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return inner_->all_reduce(device(data, count * dtype_size(dtype), "all_reduce", "buffer"),
                              count, dtype, op);
  }
  WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override {
    return inner_->broadcast(device(data, count * dtype_size(dtype), "broadcast", "buffer"), count,
                             dtype, root);
  }
  WorkPtr barrier() override { return inner_->barrier(); }

 private:
  void* device(const void* ptr, size_t bytes, const char* op, const char* role) const {
    if (bytes == 0) {
      return const_cast<void*>(ptr);
    }
    if (void* alias = map_.alias(ptr, bytes); alias != nullptr) {
      return alias;
    }
    const std::string where = map_.describe ? map_.describe(ptr) : std::string();
    throw CommError(
        op, rank(),
        fmt::format(
            "strict communicator: the {} buffer {} ({} bytes) is not device memory{}; "
            "NCCL would refuse it on a GPU: stage it through an accelerator buffer",
            role, ptr, bytes,
            where.empty() ? std::string(" (host memory)") : " (it runs past " + where + ")"));
  }

  std::unique_ptr<Communicator> inner_;
  DeviceMemoryMap map_;
};

}  // namespace

std::unique_ptr<Communicator> make_strict_communicator(std::unique_ptr<Communicator> inner,
                                                       DeviceMemoryMap map) {
  return std::make_unique<StrictCommunicator>(std::move(inner), std::move(map));
}

}  // namespace zinf::zero
