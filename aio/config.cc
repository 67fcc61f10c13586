// AioConfig validation and backend names (see aio/config.h).
#include "aio/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>

namespace zinf::aio {

std::string_view to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::kIoUring:
      return "io_uring";
    case BackendKind::kLibaio:
      return "libaio";
    case BackendKind::kPsync:
      return "psync";
  }
  return "unknown";
}

std::optional<BackendKind> parse_backend(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (BackendKind kind : {BackendKind::kIoUring, BackendKind::kLibaio, BackendKind::kPsync}) {
    if (lower == to_string(kind)) return kind;
  }
  return std::nullopt;
}

void AioConfig::validate() const {
  if (block_size == 0 || block_size % 4096 != 0) {
    throw std::invalid_argument(fmt::format(
        "aio.block_size must be a positive multiple of 4096 bytes, got {}", block_size));
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    throw std::invalid_argument(
        fmt::format("aio.queue_depth must be in [1, 4096], got {}", queue_depth));
  }
  if (intra_op_parallelism < 1 || intra_op_parallelism > 256) {
    throw std::invalid_argument(
        fmt::format("aio.intra_op_parallelism must be in [1, 256], got {}", intra_op_parallelism));
  }
  // Written so that NaN fails too. 1e9 s (~32 years) keeps deadlines far from overflow.
  if (!(io_timeout_s > 0.0 && io_timeout_s <= 1e9)) {
    throw std::invalid_argument(fmt::format(
        "zinf.io_timeout_s must be in (0, 1e9] seconds (a deadline is mandatory), got {}",
        io_timeout_s));
  }
}

}  // namespace zinf::aio
