// One measured I/O job, as `zinf io` and `zinf nvme-tune` run it: write or read `size`
// bytes of one file or block device through an AioHandle, `loops` times, timing each loop.
//
// Memory: the job streams --size through a ring of `ring_slots` pinned buffers of
// `chunk_bytes` each (chunk = block size x queue depth x threads: what the engine can have in
// flight at once), never the whole --size, so any --size runs in bounded memory. Every byte
// is still checked by --validate: the pattern is a function of the file offset, generated
// and checked chunk by chunk (outside the timed loops when the whole size fits the ring).
//
// What a job may write (a read benchmark never writes a byte the user did not ask for):
//  - a folder: zinf-io.dat inside it is the job's own file; it is removed afterwards unless
//    `keep_file` (and always after a failure);
//  - a path that does not exist: created (a read job writes the pattern into it first,
//    untimed); kept after success, removed after a failure;
//  - an existing file or a block device (sized with BLKGETSIZE64): a read job reads it as it
//    is and needs it at least `size` long; writing into it (a write job, or --validate which
//    writes the pattern first) needs `overwrite`;
//  - character devices (/dev/null, /dev/zero), FIFOs and sockets are refused.
// Before a byte is written, the free space of the file's filesystem (statvfs f_bavail, what
// df shows as available) must hold what the job adds to it: `size` less what an existing
// file already holds (a block device adds nothing); otherwise NotEnoughSpace.
//
// Throughput is reported in GB/s with GB = 10^9 bytes (fio's "MB/s" convention) and in
// GiB/s (2^30 bytes, DeepSpeed ds_io's convention). Not thread-safe; one job at a time per
// file.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "aio/config.h"
#include "aio/handle.h"

namespace zinf::tools {

struct IoJob {
  std::string path;         // a file, a block device, or a folder (zinf-io.dat is used)
  uint64_t size_bytes = 0;  // bytes per loop
  bool write = true;        // false: read
  aio::AioConfig aio;
  int loops = 3;
  bool validate = false;   // write a pattern, read back, compare (read jobs: compare each loop)
  bool keep_file = false;  // keep zinf-io.dat in a folder after the job
  bool overwrite = false;  // allow writing into an existing file or block device
  // Register the job's buffers with the handle (io_uring fixed buffers; ignored elsewhere).
  bool register_buffer = true;
};

// What a job will do, decided before any I/O (plan_io_job).
struct IoPlan {
  enum class Target { kNewFile, kFile, kBlockDevice };
  std::string file;  // the file or device actually used
  Target target = Target::kNewFile;
  bool in_folder = false;       // `file` is zinf-io.dat inside the folder given
  uint64_t existing_bytes = 0;  // size of the existing file or device
  bool prepare = false;         // a read job writes the pattern first (untimed)
  uint64_t chunk_bytes = 0;     // bytes per transfer: block size x queue depth x threads
  int ring_slots = 0;           // transfers in flight
  uint64_t ring_bytes = 0;      // pinned bytes of the ring (<= ring_slots x chunk_bytes)
  bool ring_holds_all = false;  // the whole size fits the ring: pattern work stays untimed
  uint64_t grow_bytes = 0;      // bytes the job adds to the filesystem (checked against free)
};

// plan_io_job's error when the filesystem of the file has less free space than the job adds
// to it: a usage error (`zinf io` exits 2), raised before any byte is written.
class NotEnoughSpace : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct IoLoop {
  double seconds = 0;
  double gb_per_s = 0;   // 10^9 bytes per second
  double gib_per_s = 0;  // 2^30 bytes per second
};

struct IoJobResult {
  std::string file;                // the file actually used
  bool direct_io = true;           // false: the filesystem refused O_DIRECT
  bool created_file = false;       // the job created the file (it did not exist)
  bool prepared_file = false;      // a read job had to write the file first (untimed)
  bool validated = false;          // --validate ran and every byte matched
  bool registered_buffer = false;  // the ring is an io_uring fixed buffer
  uint64_t pinned_bytes = 0;       // pinned memory the job allocated (the ring)
  aio::AioStats stats;             // of the whole job, untimed passes included
  std::vector<IoLoop> loops;
  IoLoop median;
};

// Checks the job and decides what it will do; touches nothing. Throws std::invalid_argument
// naming the option or path for anything the job would refuse (see the header comment), and
// NotEnoughSpace naming the file, the bytes needed and the bytes free.
[[nodiscard]] IoPlan plan_io_job(const IoJob& job);

// Runs the job (plan_io_job first); calls `on_loop(index, loop)` after each loop. Throws
// std::invalid_argument on a bad job, aio::IoError on I/O errors, std::runtime_error when
// validation finds a mismatch (naming the file and the first differing offset). On any
// error the transfers in flight are drained first and files the job created are removed.
IoJobResult run_io_job(const IoJob& job,
                       const std::function<void(int, const IoLoop&)>& on_loop = {});

}  // namespace zinf::tools
