// ParamSwapper: one rank's 16-bit parameter partitions (the slices this rank owns), kept
// on NVMe except for up to `max_in_cpu` elements kept in CPU memory, and brought into
// pinned pool buffers on demand for the forward and backward passes.
//
// Placement (decided once, in add() order, by offload/cpu_tier_budget.h's rule): a partition
// stays in CPU memory when it fits in what is left of `max_in_cpu` elements, otherwise it goes
// to NVMe; a later, smaller partition may still fit. A partition is never split between the
// tiers. in_cpu() tells.
//
// On NVMe a partition is stored as chunks of at most `buffer_size` elements, one extent
// each, and swapped in into one pool buffer per chunk: a partition larger than buffer_size
// is split across buffers, never refused by an assertion. One that needs more buffers than
// the pool has cannot be swapped in (OffloadError kPool at once, with the numbers); read()
// copies any partition straight into caller memory instead.
//
// prefetch() queues the reads of the given partitions as far as buffers are free now (it
// never blocks on the pool); swap_in() returns a view of the partition, reading it first
// if it was not prefetched. Every partition in flight has its own I/O queue (its own aio
// handle, taken from a small set that grows on demand to at most one per pool buffer and
// is reused), so swap_in() waits for that partition's reads only, never for a later or
// slower prefetch of another one. release() gives the buffers back without writing
// anything (params are read-only between optimizer steps); write_back() stores new values
// (after the optimizer step) in CPU memory or on NVMe, and refreshes a resident view.
//
// Errors: a failed or corrupt read is thrown by the swap_in() that waits for it, and the
// partition is then not resident (its buffers went back): the next swap_in() reads again,
// on a fresh I/O queue (a queue that saw an error, e.g. an aio engine failure, is closed).
// release() discards a partition's data, so it waits for its reads but does not report
// their errors. A failed add() leaves no partition and no extent behind.
//
// A failed write_back() or write_back_range() never leaves a mix of old and new values to
// be read: the resident view (if any) is dropped, and a partition whose new values were
// stored in some chunks but not in others is torn: swap_in() and read() throw
// OffloadError(kCorrupt) for it (prefetch() skips it) until a write_back() of the whole
// partition succeeds. A failure before any chunk took new values leaves the old ones
// readable (or, if a chunk's write failed part-way, that chunk is torn in the store, which
// reports kCorrupt likewise). So swap_in() returns all old values, all new, or throws.
//
// Pinned memory: buffer_count x buffer_size x element_bytes, fixed at construction. I/O
// threads: intra_op_parallelism per queue, at most buffer_count + 1 queues. Every queue the
// swapper makes has the pool's buffers registered (io_uring fixed buffers; when the kernel
// refuses, e.g. RLIMIT_MEMLOCK, transfers take the normal path and no later queue tries).
//
// Thread safety: one driving thread calls everything except counters(), which may be
// called from any thread; the I/O runs on aio's workers. Views stay valid until the
// partition is released or the swapper destroyed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/counters.h"
#include "offload/cpu_tier_budget.h"
#include "offload/footprint.h"
#include "offload/nvme_store.h"
#include "offload/pinned_buffer_pool.h"

namespace zinf::offload {

class Accelerator;

struct ParamSwapperConfig {
  size_t buffer_count = 5;              // offload_param.buffer_count
  uint64_t buffer_size = 100'000'000;   // offload_param.buffer_size, elements per buffer
  uint64_t max_in_cpu = 1'000'000'000;  // offload_param.max_in_cpu, elements kept in CPU
  size_t element_bytes = 2;             // 16-bit params
};

using ParamId = uint32_t;

// A resident partition: consecutive chunks of its elements, in order.
struct ParamView {
  struct Chunk {
    std::byte* data = nullptr;
    uint64_t numel = 0;
  };
  std::vector<Chunk> chunks;
  uint64_t numel = 0;
  bool in_cpu = false;
};

class ParamSwapper {
 public:
  // `store` must outlive the swapper; `accelerator` (optional) gets the pool registered.
  // Throws OffloadError(kConfig) for a zero buffer_count, buffer_size or element size. Takes
  // no extents (add() does), so a throwing constructor leaves the store as it was.
  ParamSwapper(const ParamSwapperConfig& config, NvmeStore& store,
               Accelerator* accelerator = nullptr);
  // Waits for the reads in flight, then returns every extent to the store.
  ~ParamSwapper();

  ParamSwapper(const ParamSwapper&) = delete;
  ParamSwapper& operator=(const ParamSwapper&) = delete;

  // What a swapper of `config` takes once partitions of `numels` are added in that order:
  // the pool and the CPU-tier partitions (pinned), the NVMe partitions' extents (nvme).
  [[nodiscard]] static Footprint footprint(const ParamSwapperConfig& config,
                                           const std::vector<uint64_t>& numels);

  // Registers a partition of `numel` elements (> 0) with its initial values and stores
  // them in its tier. NVMe space is checked before the first write (kSpace).
  [[nodiscard]] ParamId add(uint64_t numel, const void* initial);

  [[nodiscard]] bool in_cpu(ParamId id) const;
  [[nodiscard]] uint64_t numel(ParamId id) const;
  [[nodiscard]] bool resident(ParamId id) const;

  // Starts reading the listed NVMe partitions that are not resident, in list order, while
  // enough pool buffers are free; stops at the first that does not fit. Returns how many
  // reads it queued.
  size_t prefetch(std::span<const ParamId> ids);

  // The partition's values; waits for its reads. Blocks while the pool has no buffers for
  // it (other partitions are resident: release them) — or fails at once with kPool if it
  // could never get them. I/O errors and corrupt extents throw OffloadError.
  [[nodiscard]] ParamView swap_in(ParamId id);

  // Gives the partition's buffers back, discarding their contents (no write-back).
  void release(ParamId id);
  // Done with the partition for now, its view unchanged: its buffers keep the values as a
  // cache (waiting for its reads first), so the next prefetch() or swap_in() of it reads
  // nothing from NVMe. Cached buffers go back to the pool, least recently cached first, as
  // soon as another partition needs them; write_back() keeps a cached copy in step with the
  // stored values. The caller must not have written into the view (use release() then).
  void release_cached(ParamId id);

  // Stores new values of the whole partition, or of `numel` elements at `offset`, and
  // refreshes a resident view. On failure see "A failed write_back()" above.
  void write_back(ParamId id, const void* data);
  void write_back_range(ParamId id, uint64_t offset, const void* data, uint64_t numel);

  // A write batch: between begin_write_batch() and close_write_batch() / end_write_batch(), a
  // write_back of whole chunks of a resident (or cached) partition refreshes its view and
  // queues the chunks' writes from the view without waiting, so the writes of many
  // partitions are in flight together, and may run on after the batch is closed (an
  // optimizer step hands every partition over, closes the batch, and the writes run behind
  // the next forward, which reads the refreshed views). Other write_backs, and a second
  // write_back of a partition in the batch, first wait for the batch. Its writes are waited
  // for by end_write_batch(), a read() or release() of one of its partitions, a swap_in
  // that needs their buffers, or the destructor; a cached partition of the batch is not
  // evicted before. On failure every partition of the batch is torn (see above: its view
  // dropped, swap_in refuses it until a whole write_back) and the error (naming the file and
  // offset) is thrown by the call that waited.
  void begin_write_batch() noexcept { batching_ = true; }
  // Stops adding to the batch; its writes stay in flight.
  void close_write_batch() noexcept;
  // Stops adding to the batch and waits for its writes.
  void end_write_batch();

  // Copies the partition's current values into `dst` (any size; no pool buffers used).
  void read(ParamId id, void* dst);

  [[nodiscard]] const ParamSwapperConfig& config() const noexcept { return config_; }
  [[nodiscard]] uint64_t cpu_elements() const noexcept { return cpu_budget_.used(); }
  [[nodiscard]] uint64_t pinned_bytes() const noexcept;
  [[nodiscard]] OffloadCounters counters() const;
  // Swap-ins and prefetches served from buffers kept by release_cached(), and the NVMe
  // bytes they did not read.
  [[nodiscard]] uint64_t cache_hits() const noexcept { return cache_hits_.load(); }
  [[nodiscard]] uint64_t cache_bytes_saved() const noexcept { return cache_bytes_saved_.load(); }

 private:
  using QueuePtr = std::unique_ptr<NvmeStore::Queue>;

  struct Partition {
    uint64_t numel = 0;
    std::unique_ptr<aio::PinnedBuffer> cpu;        // the values, when kept in CPU memory
    std::vector<ExtentId> chunks;                  // NVMe: one extent per buffer_size elements
    std::vector<PinnedBufferPool::Lease> buffers;  // resident NVMe partition
    // The queue its reads are in flight on (null when none). After `buffers`: destroyed
    // first, and its destructor drains the reads before the buffers go back to the pool.
    QueuePtr reads;
    // A write-back failed after some chunks took new values: the stored chunks mix old and
    // new. Cleared by a successful write-back of the whole partition.
    bool torn = false;
    // Non-zero while `buffers` are a cache kept by release_cached(): the order it was
    // cached in (the smallest goes first when buffers are needed).
    uint64_t cached_at = 0;
    bool in_batch = false;  // its view is being written by the write batch
  };

  Partition& get(ParamId id);
  const Partition& get(ParamId id) const;
  uint64_t chunk_numel(const Partition& p, size_t chunk) const;
  // An idle queue (made when none is), and back to the idle set once drained. Only a queue
  // whose transfers all succeeded goes back: one that saw an error is destroyed, so a broken
  // aio handle (engine failure) never serves a later transfer.
  QueuePtr take_queue();
  void return_queue(QueuePtr queue) noexcept;
  // Queues the reads of every chunk of `p` into its buffers on a queue of its own.
  void queue_reads(Partition& p);
  // Waits for `p`'s reads (and nothing else). On failure drops its buffers and throws.
  void wait_reads(Partition& p);
  // Waits for the write batch's transfers; on failure tears and drops each partition of it
  // and throws. The batch stays open (batching_ unchanged).
  void wait_batch();
  // Drops the partition's buffers (and its cache mark).
  void drop_buffers(Partition& p) noexcept;
  // A cached partition taken back into use: its buffers stay, nothing is read.
  void take_cached(Partition& p);
  // Returns cached buffers to the pool, least recently cached first, until `count` more
  // buffers than are leased now fit the pool (or no cache is left).
  void evict_for(size_t count);
  // Throws OffloadError(kCorrupt) when partition `id` is torn (see Partition::torn).
  void check_not_torn(ParamId id, const Partition& p) const;

  const ParamSwapperConfig config_;
  NvmeStore& store_;
  // Before every queue: the queues, which have its buffers registered, go first.
  std::unique_ptr<PinnedBufferPool> pool_;
  bool register_pool_ = true;          // false once a queue's handle refused the pool
  std::vector<QueuePtr> idle_queues_;  // drained queues, reused by later reads and adds
  std::vector<Partition> partitions_;  // after idle_queues_: their in-flight queues drain first
  // The write batch (after partitions_: it drains before their buffers go back).
  bool batching_ = false;
  QueuePtr batch_;
  std::vector<ParamId> batch_ids_;                // partitions with writes in batch_
  CpuTierBudget cpu_budget_{config_.max_in_cpu};  // after config_
  uint64_t cache_clock_ = 0;                      // last Partition::cached_at given
  Counters counters_;
  std::atomic<uint64_t> cache_hits_{0};
  std::atomic<uint64_t> cache_bytes_saved_{0};
};

}  // namespace zinf::offload
