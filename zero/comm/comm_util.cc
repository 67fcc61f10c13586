#include "zero/comm/comm_util.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace zinf::zero::detail {

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

uintptr_t address(const void* p) noexcept { return reinterpret_cast<uintptr_t>(p); }

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) noexcept {
  if (a_bytes == 0 || b_bytes == 0) {
    return false;
  }
  return address(a) < address(b) + b_bytes && address(b) < address(a) + a_bytes;
}

void check_dtype(std::string_view name, DType dtype, int rank) {
  if (dtype_size(dtype) == 0) {
    throw CommError(std::string(name), rank,
                    "unknown dtype value " + std::to_string(static_cast<int>(dtype)));
  }
}

void check_op(std::string_view name, ReduceOp op, int rank) {
  if (op != ReduceOp::kSum && op != ReduceOp::kMax) {
    throw CommError(std::string(name), rank,
                    "unknown reduce op value " + std::to_string(static_cast<int>(op)));
  }
}

void check_buffer(std::string_view name, std::string_view which, const void* p, size_t count,
                  int rank) {
  if (p == nullptr && count > 0) {
    throw CommError(std::string(name), rank,
                    std::string(which) + " is null for " + std::to_string(count) + " elements");
  }
}

// count * elements_per_rank * dtype size must not overflow size_t.
size_t checked_bytes(std::string_view name, size_t count, size_t multiple, DType dtype, int rank) {
  const size_t element = dtype_size(dtype);
  if (multiple != 0 && count > std::numeric_limits<size_t>::max() / multiple / element) {
    throw CommError(std::string(name), rank,
                    "element count " + std::to_string(count) + " x " + std::to_string(multiple) +
                        " overflows the byte size");
  }
  return count * multiple * element;
}

}  // namespace

WorkPtr completed_work() { return std::make_unique<CompletedWork>(); }

std::string describe(std::string_view name, size_t count, DType dtype, std::string_view op) {
  std::string text(name);
  text.append(" of ");
  text.append(std::to_string(count));
  text.push_back(' ');
  text.append(to_string(dtype));
  text.append(count == 1 ? " element" : " elements");
  if (!op.empty()) {
    text.append(" (");
    text.append(op);
    text.push_back(')');
  }
  return text;
}

bool all_gather_in_place(const void* send, const void* recv, size_t count, DType dtype,
                         int rank) noexcept {
  return recv != nullptr &&
         address(send) == address(recv) + static_cast<size_t>(rank) * count * dtype_size(dtype);
}

void check_all_gather(const void* send, const void* recv, size_t count, DType dtype, int rank,
                      int world_size) {
  constexpr std::string_view kName = "all_gather";
  check_dtype(kName, dtype, rank);
  check_buffer(kName, "send", send, count, rank);
  check_buffer(kName, "recv", recv, count, rank);
  const size_t send_bytes = checked_bytes(kName, count, 1, dtype, rank);
  const size_t recv_bytes =
      checked_bytes(kName, count, static_cast<size_t>(world_size), dtype, rank);
  if (!all_gather_in_place(send, recv, count, dtype, rank) &&
      overlap(send, send_bytes, recv, recv_bytes)) {
    throw CommError(std::string(kName), rank,
                    "send overlaps recv but is not this rank's slice of it (in place needs send "
                    "== recv + rank * count)");
  }
}

void check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype,
                          ReduceOp op, int rank, int world_size) {
  constexpr std::string_view kName = "reduce_scatter";
  check_dtype(kName, dtype, rank);
  check_op(kName, op, rank);
  check_buffer(kName, "send", send, count, rank);
  check_buffer(kName, "recv", recv, count, rank);
  const size_t send_bytes =
      checked_bytes(kName, count, static_cast<size_t>(world_size), dtype, rank);
  const size_t recv_bytes = checked_bytes(kName, count, 1, dtype, rank);
  if (overlap(send, send_bytes, recv, recv_bytes)) {
    throw CommError(std::string(kName), rank, "send and recv overlap");
  }
}

void check_all_reduce(const void* data, size_t count, DType dtype, ReduceOp op, int rank) {
  constexpr std::string_view kName = "all_reduce";
  check_dtype(kName, dtype, rank);
  check_op(kName, op, rank);
  check_buffer(kName, "data", data, count, rank);
  static_cast<void>(checked_bytes(kName, count, 1, dtype, rank));
}

void check_broadcast(const void* data, size_t count, DType dtype, int root, int rank,
                     int world_size) {
  constexpr std::string_view kName = "broadcast";
  check_dtype(kName, dtype, rank);
  check_buffer(kName, "data", data, count, rank);
  static_cast<void>(checked_bytes(kName, count, 1, dtype, rank));
  if (root < 0 || root >= world_size) {
    throw CommError(
        std::string(kName), rank,
        "root " + std::to_string(root) + " is outside [0, " + std::to_string(world_size) + ")");
  }
}

}  // namespace zinf::zero::detail
