// NvmeStore: one rank's swap file for tensors offloaded to NVMe, cut into extents.
//
// The file is `<nvme_path>/zinf_swap/rank<r>/<name>.swp` (offload/swap_folder.h). Extents are
// handed out by a first-fit allocator (offload/extent_allocator.h: freed extents are reused,
// neighbours merged) at offsets and capacities that are multiples of 4096 bytes, so every
// transfer is O_DIRECT-ready; the bytes move through aio::AioHandle (io_uring/libaio/psync,
// buffered fallback on tmpfs). The queues' members live in offload/nvme_queue.cc.
//
// Striping (`nvme_paths`, several folders, e.g. one per drive): each folder gets its own
// swap file (and lock) under <folder>/zinf_swap/rank<r>/, and every queue its own aio
// handle per folder (own worker threads, rings and descriptors). Extents live in one
// logical address space that is striped RAID-0 style: stripe unit k (`stripe_bytes`, 1 MiB
// by default) lies in file k mod n, at (k div n) * stripe_bytes. An extent of several
// units is thus read and written from all drives at once; whole extents spread round-robin
// would give one large extent the bandwidth of one drive, and the swappers move a few large
// extents at a time. The default unit equals aio's default block_size, so striping adds no
// requests: each unit is one request either way. Free space is checked and reserved per
// folder (an error names the folder's file, its needed and free bytes). With one folder the
// logical offset is the file offset and nothing is split: the store behaves as before.
//
// Space: allocate() is bookkeeping only. A write to an extent whose bytes are not reserved
// yet first checks the free space of the file system (statvfs) and reserves them with
// fallocate, so an ENOSPC cannot strike mid-run: everything allocated when it fits, else
// just up to the end of that extent (one allocation that does not fit never stops writes to
// the extents that do). When not even that fits it fails with OffloadError(kSpace) naming
// the path, the needed and the free bytes. reserve() reserves everything allocated, or
// fails the same way (e.g. at start-up, before any work). free() of the last extent(s) of
// the file lowers its end: the file shrinks and the space goes back to the file system.
// A file system without fallocate (EOPNOTSUPP) gets the file's size set instead (ftruncate):
// nothing is reserved, so ENOSPC can strike mid-run. One warning names the file system (type
// and mount point) when that is first seen; an ENOSPC then is a clean OffloadError(kIo)
// naming the file, the offset and that missing reservation.
//
// Lifetime on disk: a `<name>.lock` beside the file is flock()ed while the store lives. A
// swap file whose lock nobody holds is left over from a crashed run: it is reported (one
// warning) and replaced. A lock held by a live process is an error. The destructor (clean
// exit) removes the file, the lock, and rank<r>/ and zinf_swap/ when they are empty.
//
// Integrity: every extent remembers whether its last write completed; reading one whose
// write failed (a torn extent) or that was never written is an error, never stale bytes.
// With `checksums` (the default), an xxh3-64 of each extent is taken when it is written and
// verified when it is read: a mismatch is OffloadError(kCorrupt) naming the file and offset.
//
// Thread safety: every method of NvmeStore may be called from any thread. A Queue belongs
// to one thread at a time; several queues may run concurrently on one store, provided no
// extent is written while another transfer of it (on any queue) is in flight, and none is
// freed while one is. Queues must not outlive their store.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "aio/config.h"
#include "aio/file_cache.h"
#include "aio/handle.h"
#include "offload/error.h"
#include "offload/extent_allocator.h"
#include "offload/swap_folder.h"

namespace zinf::offload {

struct NvmeStoreConfig {
  std::string nvme_path;  // offload_*.nvme_path: the directory that receives zinf_swap/
  // zinf.nvme_paths: several directories to stripe across; when not empty it replaces
  // nvme_path. Each must exist; none may appear twice.
  std::vector<std::string> nvme_paths;
  uint64_t stripe_bytes = 1 << 20;  // striping unit; a positive multiple of 4096
  int rank = 0;                     // picks rank<r>/
  std::string name = "store";       // file stem: <name>.swp, <name>.lock
  aio::AioConfig aio;               // the `aio` config block
  bool checksums = true;            // xxh3-64 per extent, verified on read (zinf.swap_checksums)
  // Builds each aio worker's backend; empty: aio's default for `aio.backend`. Tests pass a
  // fault-injecting factory here.
  aio::BackendFactory backend_factory;
};

using ExtentId = uint32_t;

// Test seam: replaces fallocate(2) for every NvmeStore of the process (nullptr restores it).
// The function returns 0 or -errno. Lets tests take the path of a file system without
// fallocate (EOPNOTSUPP) on one that has it. Set it only while no store reserves space.
using FallocateFunction = int (*)(int fd, int mode, int64_t offset, int64_t length);
void set_fallocate_function_for_testing(FallocateFunction function);

struct ExtentInfo {
  uint64_t file_offset = 0;  // bytes; multiple of 4096 (striped: in the logical space)
  uint64_t bytes = 0;        // as allocated
  uint64_t capacity = 0;     // bytes reserved in the file; multiple of 4096
};

struct NvmeStoreStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t reads = 0;              // extent reads completed (verified when checksums are on)
  uint64_t writes = 0;             // extent writes completed
  uint64_t file_bytes = 0;         // size of the allocated span (striped: logical, all files)
  uint64_t reserved_bytes = 0;     // bytes fallocated so far (striped: logical, all files)
  uint64_t io_requests = 0;        // aio requests of the transfers waited for, on all queues
  uint64_t fixed_io_requests = 0;  // of io_requests: those that used a registered buffer
  bool buffered = false;           // the file system refused O_DIRECT (tmpfs)
  bool replaced_stale = false;     // a swap file from a crashed run was found and replaced
  bool no_fallocate = false;       // a file system has no fallocate: space is not reserved
};

class NvmeStore {
 public:
  // A batch of asynchronous extent transfers with its own aio handle (own worker threads),
  // so a reader and a writer can wait for their own transfers only.
  class Queue {
   public:
    ~Queue();
    Queue(const Queue&) = delete;
    Queue& operator=(const Queue&) = delete;

    // Queue a transfer of the whole extent (its allocated bytes) and return at once.
    // `buffer` must hold ExtentInfo::bytes bytes and stay untouched until wait() returns.
    // A write first reserves file space if needed (may throw kSpace).
    void async_read(ExtentId id, void* buffer);
    void async_write(ExtentId id, const void* buffer);

    // Waits for every queued transfer. On success reads are verified (checksums) and
    // writes recorded. If any transfer failed, all are still waited for, every write of
    // the batch is marked torn, and the first error is thrown: OffloadError(kIo) for an I/O
    // error (naming the file, offset and length of the failed request), kCorrupt for a
    // checksum mismatch or a torn/never-written source extent. After an I/O error the
    // queue's aio handle is replaced by a new one (with the registered ranges registered
    // again), so an engine that broke, or a transfer that timed out, never serves the
    // queue's later transfers; one warning line says so.
    void wait();

    [[nodiscard]] size_t pending() const noexcept { return pending_.size(); }

    // Registers long-lived memory (a pinned pool's ranges()) with this queue's aio handles,
    // so transfers whose buffer lies inside one range use io_uring fixed buffers (see
    // aio::AioHandle::register_buffers). Returns false when the backend has none or the
    // kernel refused them (for any of the handles); transfers work either way. The ranges must stay
    // mapped until unregister_buffers() for them has returned or the queue is destroyed. Blocks
    // until the handle's workers use the new table (they first finish the requests they hold).
    bool register_buffers(std::span<const std::pair<void*, size_t>> ranges);
    void unregister_buffers(std::span<const std::pair<void*, size_t>> ranges);

   private:
    friend class NvmeStore;
    explicit Queue(NvmeStore& store);

    struct Pending {
      ExtentId id;
      bool is_write;
      void* buffer;
      uint64_t offset;  // bytes into the extent
      uint64_t bytes;
      uint64_t checksum;     // writes: hash of the source; reads: the expected hash
      bool verify;           // a whole-extent read under checksums
      uint64_t file_offset;  // for messages
    };

    // Any part of an extent; whole-extent reads are verified when checksums are on.
    void async_transfer(ExtentId id, uint64_t offset, uint64_t bytes, void* buffer, bool is_write);
    [[nodiscard]] std::unique_ptr<aio::AioHandle> make_handle() const;
    // The handle of device `device`, made anew (with registered_ registered) when the last
    // one was dropped after a failure.
    aio::AioHandle& handle(size_t device);
    // Queues the piece(s) of a transfer at logical `offset` on the devices' handles, counting
    // in `queued` those queued (the rest are not, when it throws).
    void submit(bool is_write, void* buffer, uint64_t bytes, uint64_t offset, size_t& queued);

    // wait()'s steps, in this order. An `error` already set is the first error and stays:
    // later steps only add one when there is none yet.
    struct LaneTotals {  // what the lanes' handles did since the last wait()
      uint64_t requests = 0;
      uint64_t fixed_requests = 0;
      bool buffered = false;  // a handle's file fell back to buffered I/O
    };
    // Waits for every lane's handle, adding up their new requests; a lane whose wait failed
    // gets its handle dropped (one warning).
    LaneTotals collect_lanes(std::optional<OffloadError>& error);
    // Waits for lane `device`'s handle; returns whether it failed (recorded in `error`).
    bool wait_lane(size_t device, std::optional<OffloadError>& error);
    // Hashes each verified read's buffer; a mismatch sets `error` (kCorrupt).
    void verify_reads(std::optional<OffloadError>& error) const;
    // Under the store's lock: adds the totals to its counters, marks every write valid (with
    // its checksum) or, after an I/O error, torn, and counts the reads when nothing failed.
    void settle(const LaneTotals& totals, const std::optional<OffloadError>& error);

    // Per device of the store.
    struct Lane {
      std::unique_ptr<aio::AioHandle> io;  // null after a failure until the next transfer
      bool checked_buffered = false;       // io's O_DIRECT fallback reported to the store
      aio::AioStats reported;              // io->stats() already added to the store's totals
    };

    NvmeStore& store_;
    std::vector<Lane> lanes_;
    std::vector<Pending> pending_;
    std::vector<std::pair<void*, size_t>> registered_;  // register_buffers() ranges
    std::optional<std::string> submit_error_;  // a transfer queued only in part: its failure
  };

  // Creates the directories, takes the locks, replaces stale swap files. Throws
  // OffloadError(kConfig) for no path (or a path given twice, or a bad stripe_bytes), kIo
  // when a directory or lock file cannot be made or another live process holds a lock;
  // std::invalid_argument for a bad aio config.
  explicit NvmeStore(NvmeStoreConfig config);
  ~NvmeStore();

  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // The (first) swap file and its directory; all of them, one per path, in path order.
  [[nodiscard]] const std::string& path() const noexcept { return devices_.front().path; }
  [[nodiscard]] const std::string& directory() const noexcept { return devices_.front().directory; }
  [[nodiscard]] std::vector<std::string> paths() const;
  [[nodiscard]] std::vector<std::string> directories() const;
  [[nodiscard]] const NvmeStoreConfig& config() const noexcept { return config_; }

  // Reserves an extent of `bytes` bytes (> 0) in the file (bookkeeping only).
  [[nodiscard]] ExtentId allocate(uint64_t bytes);
  // Returns the extent's space for reuse; the id becomes invalid. Freeing the end of the file
  // shrinks it (its reserved bytes go back to the file system).
  void free(ExtentId id);
  [[nodiscard]] ExtentInfo extent(ExtentId id) const;

  // Checks free space for everything allocated and not yet reserved, and reserves it.
  // Throws OffloadError(kSpace) naming path, needed and free bytes; nothing is reserved
  // then, and extents reserved earlier keep working.
  void reserve();

  // Synchronous whole-extent transfers (see Queue for the errors).
  void write(ExtentId id, const void* buffer);
  void read(ExtentId id, void* buffer);

  // Synchronous transfer of part of an extent: `bytes` at `offset` bytes into it. With
  // checksums a partial write reads, verifies, patches and rewrites the whole extent. A
  // partial write to a never-written extent leaves the rest zero.
  void write_range(ExtentId id, uint64_t offset, const void* buffer, uint64_t bytes);
  void read_range(ExtentId id, uint64_t offset, void* buffer, uint64_t bytes);

  [[nodiscard]] std::unique_ptr<Queue> make_queue();

  [[nodiscard]] NvmeStoreStats stats() const;

 private:
  enum class ExtentState : uint8_t { kFree, kEmpty, kValid, kTorn };
  struct Extent {
    ExtentInfo info;
    ExtentState state = ExtentState::kFree;
    uint64_t checksum = 0;
    bool in_flight_write = false;
  };

  // Caller holds mutex_.
  Extent& checked(ExtentId id, uint64_t offset, uint64_t bytes, const char* op);
  // Makes sure the logical bytes below `needed_end` are reserved: reserves everything
  // allocated when the file systems have room for it, else just up to `needed_end`. Throws
  // OffloadError(kSpace) when not even that fits (nothing is reserved then).
  void reserve_locked(uint64_t needed_end);
  // Reserves logical [reserved_, target) in every file, or throws with `failure` set to the
  // reason it does not fit (kSpace) and nothing reserved.
  bool try_reserve_locked(uint64_t target, std::string& failure);
  // Sets every file's size to its share of logical bytes [0, logical_end); best effort.
  void shrink_files_locked(uint64_t logical_end) noexcept;
  // Bytes of logical [0, logical_end) that lie in device `device`'s file.
  [[nodiscard]] uint64_t device_bytes(size_t device, uint64_t logical_end) const noexcept;

  // One swap folder: its file, lock and descriptors (lock_fd flock()ed while the store
  // lives, file_fd kept open for fallocate).
  struct Device : SwapFolder {
    bool no_fallocate = false;  // guarded by mutex_: its reservations are ftruncates
  };
  // Removes the swap files, the lock files and the rank<r>/ and zinf_swap/ directories when
  // they are empty.
  void remove_files() noexcept;

  const NvmeStoreConfig config_;
  std::vector<Device> devices_;  // one per path; fixed after construction (but no_fallocate)
  std::string label_;            // the swap file(s), for messages

  mutable std::mutex mutex_;
  std::vector<Extent> extents_;     // guarded by mutex_; index = ExtentId
  ExtentSpans spans_;               // guarded by mutex_: the extents' logical bytes
  uint64_t reserved_ = 0;           // guarded by mutex_: bytes fallocated (the file
                                    // size; > spans_.end() only if shrinking failed)
  uint64_t bytes_read_ = 0;         // guarded by mutex_
  uint64_t bytes_written_ = 0;      // guarded by mutex_
  uint64_t reads_ = 0;              // guarded by mutex_
  uint64_t writes_ = 0;             // guarded by mutex_
  uint64_t io_requests_ = 0;        // guarded by mutex_
  uint64_t fixed_io_requests_ = 0;  // guarded by mutex_
  bool buffered_ = false;           // guarded by mutex_: some queue fell back
  bool replaced_stale_ = false;     // set in the constructor only

  std::mutex sync_mutex_;
  std::unique_ptr<Queue> sync_queue_;  // guarded by sync_mutex_: the synchronous calls
};

}  // namespace zinf::offload
