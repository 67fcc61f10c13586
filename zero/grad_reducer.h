// GradReducer: takes each parameter's gradient as backward produces it, averages it over the
// data-parallel ranks in buckets, and hands every rank the slices it owns
// (PartitionedOptimizer::accumulate), while the rest of backward runs.
//
// A gradient is copied (converted to the communication type: communication_data_type, else
// the gradients' own) into the open bucket, as its padded flat elements; a bucket holds up
// to reduce_bucket_size elements (a larger parameter gets a bucket of its own). A full
// bucket is rearranged rank-major — rank r's slices of every parameter side by side — and
// reduce-scattered, so each rank receives exactly its slices summed over the ranks (with
// `reduce_scatter: false`: all-reduced, and each rank keeps its slices). With overlap_comm
// at most two buckets are in flight while the next one fills; without it each bucket is
// waited for at once. Received slices are scaled by 1 / world size and accumulated into the
// owner's partition.
//
// Stage 0 (plain data parallelism) gives the reducer a world-size-1 layout: buckets are
// all-reduced and every rank keeps every gradient. With one rank nothing is communicated:
// gradients go straight to the partition.
//
// Tied parameters: a parameter set to expect n > 1 contributions per micro-batch (one per
// block that uses it, plus autograd's for uses outside blocks) is summed in fp32 until the
// n-th arrives, then bucketed once. Whatever is still pending at end_micro_batch() is
// bucketed then, in parameter order (every rank does the same, so collectives match).
//
// Device discipline: buckets are device memory (the accelerator's), filled, padded and
// rearranged by LibTorch ops on the accelerator's compute views, and reduced by the
// communicator in place on the device. Host code reads only this rank's reduced slices, after
// the accelerator copies them into a pinned staging buffer (accelerators whose device memory
// is host memory, the CPU one, skip that copy). With one rank a gradient goes from the device
// to the staging buffer the same way.
//
// Thread safety: none; the thread running backward calls everything (collectives are issued
// in the same order on every rank because backward visits parameters in the same order).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/accelerator.h"
#include "offload/footprint.h"
#include "zero/comm/communicator.h"
#include "zero/partition.h"
#include "zero/partitioned_optimizer.h"
#include "zero/zero_config.h"

namespace zinf::zero {

struct GradReducerStats {
  uint64_t buckets = 0;
  uint64_t bytes_sent = 0;    // bucket bytes handed to collectives
  double wait_seconds = 0.0;  // time backward blocked waiting for reductions
  uint64_t peak_bucket_elements = 0;
};

class GradReducer {
 public:
  // `grad_dtype`: element type of the gradients add() receives. Bucket memory comes from
  // `accelerator` (device memory). Every reference must outlive the reducer.
  GradReducer(const PartitionLayout& layout, const ZeroConfig& config, Communicator& comm,
              DType grad_dtype, PartitionedOptimizer& optimizer, offload::Accelerator& accelerator);
  ~GradReducer();

  // What a reducer allocates for trainable parameters of `numels` elements (layout order) on
  // `world` ranks: the buckets on the device, and the pinned staging buffer when host code
  // cannot read device memory (`host_reads_device` false: CUDA, strict).
  [[nodiscard]] static offload::Footprint footprint(const ZeroConfig& config, int world,
                                                    const std::vector<uint64_t>& numels,
                                                    bool host_reads_device);

  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Parameter `param` (a layout index) receives `count` >= 1 gradient contributions per
  // micro-batch (default 1).
  void set_contributions(size_t param, int count);

  void begin_micro_batch(int micro_batch);
  // One contribution to `param`'s gradient: a tensor of its numel elements (any shape,
  // dtype and layout, on the accelerator's compute device), or an undefined tensor for a zero
  // contribution. The tensor may be reused as soon as this returns.
  void add(size_t param, const at::Tensor& grad);
  // Reduces what is left, waits for every reduction and closes the micro-batch in the
  // optimizer.
  void end_micro_batch();

  [[nodiscard]] const GradReducerStats& stats() const noexcept { return stats_; }
  [[nodiscard]] DType comm_dtype() const noexcept { return comm_dtype_; }
  // Device bytes held by the buckets.
  [[nodiscard]] uint64_t bucket_bytes() const noexcept;
  // Pinned host bytes of the staging buffer (none where host code reads device memory).
  [[nodiscard]] uint64_t pinned_bytes() const noexcept { return staging_.capacity(); }

 private:
  struct InFlight {
    WorkPtr work;
    size_t slot = 0;
    uint64_t count = 0;  // elements per rank region (reduce-scatter count)
    std::vector<std::pair<size_t, uint64_t>> params;  // (param, offset in the rank region)
  };

  void add_to_bucket(size_t param, const at::Tensor& grad);
  void issue_bucket();
  void finish_oldest();
  void process(InFlight& bucket);
  // `count` elements of comm_dtype_ at `device` (device memory), readable by host code: the
  // pointer itself, or a pinned copy of it.
  const void* to_host(const void* device, uint64_t count);
  // A flat tensor over `buffer`'s compute view.
  at::Tensor view(const offload::DeviceBuffer& buffer, DType dtype);

  const PartitionLayout& layout_;
  const ZeroConfig config_;
  Communicator& comm_;
  const DType grad_dtype_;
  DType comm_dtype_;
  PartitionedOptimizer& optimizer_;
  offload::Accelerator& accelerator_;
  const bool host_reads_device_;             // accelerator_.host_reads_device_memory()
  std::unique_ptr<offload::Stream> stream_;  // device -> pinned copies
  aio::PinnedBuffer staging_;                // host side of those copies
  const int world_;
  const bool stage0_;  // the layout has world size 1 while the ranks are many

  uint64_t capacity_ = 0;          // elements per bucket
  offload::DeviceBuffer fill_;     // param-major: [param][padded elements]
  offload::DeviceBuffer send_[2];  // rank-major copy of a full bucket
  offload::DeviceBuffer recv_[2];  // this rank's region after a reduce-scatter
  at::Tensor fill_view_;
  at::Tensor send_view_[2];
  uint64_t fill_used_ = 0;
  std::vector<std::pair<size_t, uint64_t>> fill_params_;  // (param, offset in fill_)
  std::deque<InFlight> in_flight_;
  size_t next_slot_ = 0;

  std::vector<int> contributions_;   // expected per micro-batch
  std::vector<int> received_;        // this micro-batch
  std::vector<at::Tensor> pending_;  // tied params' partial sums (fp32, on the device)
  GradReducerStats stats_;
};

}  // namespace zinf::zero
