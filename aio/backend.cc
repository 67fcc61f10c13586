// Backend helpers shared by the engines, and the engine chooser.
#include "aio/backend.h"

namespace zinf::aio {

std::string_view to_string(Op op) { return op == Op::kRead ? "read" : "write"; }

std::unique_ptr<Backend> make_backend(const AioConfig& config) {
  const auto depth = static_cast<unsigned>(config.queue_depth);
  switch (config.backend) {
    case BackendKind::kIoUring:
      return make_io_uring_backend(depth);
    case BackendKind::kLibaio:
      return make_libaio_backend(depth);
    case BackendKind::kPsync:
      return make_psync_backend(depth);
  }
  return make_psync_backend(depth);
}

}  // namespace zinf::aio
