#include "zero/comm/communicator.h"

#include <string>

namespace zinf::zero {

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat64:
      return "fp64";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

namespace {

std::string comm_error_message(const std::string& op, int rank, const std::string& message) {
  std::string text("zinf comm: ");
  text.append(op);
  if (rank >= 0) {
    text.append(" on rank ");
    text.append(std::to_string(rank));
  }
  text.append(": ");
  text.append(message);
  return text;
}

}  // namespace

CommError::CommError(std::string op, int rank, const std::string& message)
    : std::runtime_error(comm_error_message(op, rank, message)), op_(std::move(op)), rank_(rank) {}

}  // namespace zinf::zero
