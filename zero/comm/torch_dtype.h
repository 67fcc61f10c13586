// The LibTorch scalar type of a communicator DType, for code that wraps zinf buffers in
// at::Tensor (the Gloo communicator's c10d calls, ZeroModel's parameter views).
//
// Internal to zinf: this header includes LibTorch's ATen headers, so only .cc files that
// already use LibTorch include it; the public zinf_comm headers stay free of LibTorch.
//
// Thread safety: a pure function.
#pragma once

#include <c10/core/ScalarType.h>

#include "zero/comm/communicator.h"

namespace zinf::zero::detail {

// kFloat32 -> at::kFloat, kBFloat16 -> at::kBFloat16, kFloat16 -> at::kHalf,
// kFloat64 -> at::kDouble, kInt64 -> at::kLong; a value outside the enum gives at::kFloat
// (callers check dtypes before they get here).
[[nodiscard]] inline c10::ScalarType scalar_type(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return c10::kFloat;
    case DType::kBFloat16:
      return c10::kBFloat16;
    case DType::kFloat16:
      return c10::kHalf;
    case DType::kFloat64:
      return c10::kDouble;
    case DType::kInt64:
      return c10::kLong;
  }
  return c10::kFloat;
}

}  // namespace zinf::zero::detail
