// Parameters of an aio handle, with DeepSpeed's names and defaults (the `aio` block of a
// DeepSpeed config), plus zinf's own `backend` choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zinf::aio {

enum class BackendKind {
  kIoUring,  // liburing; default
  kLibaio,   // Linux native AIO (io_submit/io_getevents)
  kPsync,    // pread/pwrite on the handle's worker threads; works everywhere
};

std::string_view to_string(BackendKind kind);
// Accepts "io_uring", "libaio", "psync" (case-insensitive); nullopt otherwise.
std::optional<BackendKind> parse_backend(std::string_view name);

struct AioConfig {
  uint64_t block_size = 1 << 20;  // bytes per request submitted to the kernel
  int queue_depth = 8;            // requests in flight per worker thread
  int intra_op_parallelism = 1;   // worker threads one read/write is split over
  bool single_submit = false;     // submit requests one by one instead of in batches
  bool overlap_events = true;     // refill the queue as completions arrive
  BackendKind backend = BackendKind::kIoUring;
  // Deadline of every wait on I/O, in seconds (zinf.io_timeout_s): a transfer not complete
  // by then fails with an IoError and breaks the handle (see aio/handle.h). Always > 0.
  double io_timeout_s = 300.0;

  // Throws std::invalid_argument naming the key when a value is out of range
  // (block_size must be a positive multiple of 4096, queue_depth in [1, 4096],
  // intra_op_parallelism in [1, 256], io_timeout_s in (0, 1e9]).
  void validate() const;
};

}  // namespace zinf::aio
