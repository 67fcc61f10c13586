// One measured I/O job, as `zinf io` and `zinf nvme-tune` run it: write or read `size`
// bytes of one file through an AioHandle, `loops` times, timing each loop.
//
// Throughput is reported in GB/s with GB = 10^9 bytes (fio's "MB/s" convention) and in
// GiB/s (2^30 bytes, DeepSpeed ds_io's convention). Not thread-safe; one job at a time per
// file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aio/config.h"
#include "aio/handle.h"

namespace zinf::tools {

struct IoJob {
  std::string path;         // a file, or a folder in which zinf-io.dat is used
  uint64_t size_bytes = 0;  // bytes per loop
  bool write = true;        // false: read
  aio::AioConfig aio;
  int loops = 3;
  bool validate = false;   // write a pattern, read back, compare (read jobs: compare each loop)
  bool keep_file = false;  // keep zinf-io.dat in a folder after the job
  // Register the job's buffer with the handle (io_uring fixed buffers; ignored elsewhere).
  bool register_buffer = true;
};

struct IoLoop {
  double seconds = 0;
  double gb_per_s = 0;   // 10^9 bytes per second
  double gib_per_s = 0;  // 2^30 bytes per second
};

struct IoJobResult {
  std::string file;                // the file actually used
  bool direct_io = true;           // false: the filesystem refused O_DIRECT
  bool prepared_file = false;      // a read job had to write the file first (untimed)
  bool validated = false;          // --validate ran and every byte matched
  bool registered_buffer = false;  // the buffer is an io_uring fixed buffer
  aio::AioStats stats;             // of the whole job, untimed passes included
  std::vector<IoLoop> loops;
  IoLoop median;
};

// Runs the job; calls `on_loop(index, loop)` after each loop. Throws aio::IoError on I/O
// errors, std::invalid_argument on a bad job, std::runtime_error when validation finds a
// mismatch (naming the file and the first differing offset).
IoJobResult run_io_job(const IoJob& job,
                       const std::function<void(int, const IoLoop&)>& on_loop = {});

}  // namespace zinf::tools
