// ParamStore: where stage 3 keeps the 16-bit (or fp32) slices of the parameters it manages,
// and how a full parameter is brought to the device — the ParamFetcher the
// ParamCoordinator drives.
//
// Tiers (offload_param.device):
//   none  the slice lives in device memory for the whole run;
//   cpu   in host memory (locked when offload_param.pin_memory);
//   nvme  in the ParamSwapper (swap files; the first max_in_cpu elements in CPU memory).
// Levels of a fetch, as the coordinator issues them:
//   read    nvme only: the swapper starts reading the slice into pinned pool buffers. At most
//           the pool minus the largest slice's buffers are taken by reads ahead, so a slice
//           needed at once can always be read.
//   copy    cpu/nvme: the slice (waiting for its read) is copied host->device on the H2D
//           stream into a device buffer of slice_numel elements.
//   gather  waits for the copy, then all-gathers the ranks' slices into a device buffer of
//           world_size x slice_numel elements — the padded parameter, whose first numel
//           elements are the full parameter. With world size 1 there is nothing to gather:
//           the device slice is the full parameter (for tier none, the resident slice itself).
// Releasing waits for whatever is in flight and frees the device buffers, so the
// accelerator's memory statistics show the real high-water of gathered parameters. A
// released nvme slice stays in the swapper's pinned buffers as a cache
// (ParamSwapper::release_cached) until the pool needs them: a later fetch of it (the
// backward after the forward, the next micro-batch) reads nothing from NVMe while the pool
// holds it.
//
// Write-back (tier nvme): an optimizer step hands a slice's new values over per sub-group,
// so a slice that a sub-group boundary cuts arrives in pieces. The store keeps such pieces
// in host memory (one slice's bytes while they arrive) and stores the slice once, whole, when
// they cover it — each extent written once, nothing read (a piece stored alone would make
// the swap file read and rewrite its whole extent to keep the checksum). Pieces that never
// cover their slice are stored as they are by flush_writes(), or before the slice is read
// or fetched; the destructor drops them.
//
// The store knows nothing of LibTorch: `on_gathered(m, data)` and `on_released(m)` let the
// caller bind a parameter's tensor to the gathered memory and unbind it again.
//
// Thread safety: none; the driving thread calls everything (the I/O, copies and
// collectives it issues run on their own threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/accelerator.h"
#include "offload/param_swapper.h"
#include "zero/comm/communicator.h"
#include "zero/param_coordinator.h"
#include "zero/partition.h"
#include "zero/zero_config.h"

namespace zinf::zero {

// The param swapper's settings from offload_param (nvme), for slices of `precision`.
[[nodiscard]] offload::ParamSwapperConfig param_swapper_config(const ZeroConfig& config);

struct ParamStoreStats {
  uint64_t gathers = 0;              // all-gathers issued
  uint64_t gathered_bytes = 0;       // bytes received by them
  uint64_t h2d_bytes = 0;            // host->device bytes copied
  double wait_seconds = 0.0;         // time the driving thread blocked for reads, copies, gathers
  double gather_wait_seconds = 0.0;  // of which: waiting for all-gathers
};

class ParamStore final : public ParamFetcher {
 public:
  struct Options {
    OffloadTarget tier = OffloadTarget::kNone;
    DType dtype = DType::kFloat32;  // element type of the slices and gathered params
    bool pin_memory = true;         // tier cpu: lock the host slices
  };

  // Manages layout params `layout_params[m]` for m = 0.. (the coordinator's indices).
  // `swapper` is required for tier nvme. Every reference must outlive the store.
  ParamStore(const Options& options, const PartitionLayout& layout,
             std::vector<size_t> layout_params, offload::Accelerator& accelerator,
             Communicator& comm, offload::ParamSwapper* swapper);
  ~ParamStore() override;

  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  [[nodiscard]] size_t size() const noexcept { return params_.size(); }
  [[nodiscard]] size_t layout_param(size_t m) const { return params_.at(m).layout_index; }

  // Stores managed param m's slice (slice_numel elements of the store's dtype, padding
  // included). Must be called once for every m before the first fetch.
  void set_slice(size_t m, const void* slice);
  // Overwrites `numel` elements of the slice at `slice_offset` (after an optimizer step).
  // The param must not be gathered or in flight (release it first). Tier nvme: a write
  // that covers part of a slice kept on NVMe (a slice cut by sub-groups) is collected in
  // host memory until the slice's pieces cover it, then stored once, whole — a piece
  // stored on its own would be a read-modify-write of its extent under swap checksums.
  void write_slice(size_t m, uint64_t slice_offset, const void* data, uint64_t numel);
  // Stores what write_slice() collected of slices not yet covered (piece by piece), so
  // the stored values are the written ones. Call at the end of a step; fetches and
  // read_slice() do it for their param first.
  void flush_writes();
  // Tier nvme: the write_slice() calls between begin and close go out as one write batch
  // (ParamSwapper::begin_write_batch): the slices' writes are in flight together and run on
  // after close_write_batch(); end_write_batch() waits for them (throwing a failure, the
  // slices of the batch torn). Other tiers: nothing.
  void begin_write_batch() noexcept {
    if (swapper_ != nullptr) swapper_->begin_write_batch();
  }
  void close_write_batch() noexcept {
    if (swapper_ != nullptr) swapper_->close_write_batch();
  }
  void end_write_batch() {
    if (swapper_ != nullptr) swapper_->end_write_batch();
  }
  // Copies the slice (slice_numel elements) to host memory `dst`.
  void read_slice(size_t m, void* dst);

  // The gathered parameter (device memory, at least numel elements), or null.
  [[nodiscard]] void* full_data(size_t m) const;

  void set_callbacks(std::function<void(size_t m, void* data)> on_gathered,
                     std::function<void(size_t m)> on_released);

  // ParamFetcher.
  bool start_read(size_t m) override;
  void start_copy(size_t m) override;
  void start_gather(size_t m) override;
  void wait_gathered(size_t m) override;
  void release(size_t m) override;

  [[nodiscard]] ParamStoreStats stats() const noexcept { return stats_; }
  // Host bytes held by slices: plain (tier cpu without pin_memory) and pinned (tier cpu
  // with pin_memory, and the partitions the swapper keeps in CPU memory under max_in_cpu;
  // whole pages, as allocated).
  [[nodiscard]] uint64_t host_bytes() const noexcept;
  [[nodiscard]] uint64_t pinned_bytes() const;

 private:
  // Updated values of a slice on NVMe handed over in pieces, until the pieces cover it.
  struct PendingWrite {
    std::unique_ptr<std::byte[]> values;                // slice_numel elements
    std::vector<std::pair<uint64_t, uint64_t>> pieces;  // (slice offset, numel) written
    uint64_t written_numel = 0;                         // sum of the pieces' numel
  };

  struct Param {
    size_t layout_index = 0;
    uint64_t numel = 0;
    uint64_t slice_numel = 0;
    offload::DeviceBuffer device_slice;        // tier none: resident; else the copy in flight
    aio::PinnedBuffer host_slice;              // tier cpu (pinned)
    std::unique_ptr<std::byte[]> plain_slice;  // tier cpu without pin_memory
    offload::ParamId swap_id = 0;              // tier nvme
    bool swapped_in = false;                   // the swapper holds its pool buffers
    bool read_started = false;
    bool copy_started = false;
    std::unique_ptr<offload::Event> copied;  // recorded after the H2D copy
    offload::DeviceBuffer full;              // the gathered param (world size > 1)
    WorkPtr gather;
    bool gathered = false;                  // wait_gathered() done
    std::unique_ptr<PendingWrite> pending;  // tier nvme: write_slice() pieces not yet stored
  };

  [[nodiscard]] uint64_t slice_bytes(const Param& p) const noexcept {
    return p.slice_numel * element_bytes_;
  }
  [[nodiscard]] size_t chunks_of(const Param& p) const noexcept;
  [[nodiscard]] const std::byte* host_slice(const Param& p) const noexcept;
  void wait_copy(Param& p);
  void drop_swap(Param& p);
  // Stores p's pending pieces, one by one (see flush_writes()).
  void flush_pending(Param& p);

  const Options options_;
  const size_t element_bytes_;
  const PartitionLayout& layout_;
  offload::Accelerator& accelerator_;
  Communicator& comm_;
  offload::ParamSwapper* const swapper_;
  std::unique_ptr<offload::Stream> h2d_;
  std::vector<Param> params_;
  size_t read_ahead_buffers_ = 0;  // swapper pool buffers reads ahead may hold
  size_t held_buffers_ = 0;        // swapper pool buffers held by this store now
  std::function<void(size_t, void*)> on_gathered_;
  std::function<void(size_t)> on_released_;
  ParamStoreStats stats_;
};

}  // namespace zinf::zero
