// Whether this binary can compute on CUDA here (no LibTorch headers: `zinf --version` and the
// config resolution ask too).
#pragma once

#include <string>

namespace zinf::engine {

// Why `zinf train` cannot compute on CUDA here: LibTorch built without CUDA, zinf built
// without the CUDA toolkit, or no usable device. Empty when it can.
[[nodiscard]] std::string cuda_compute_unavailable_reason();

}  // namespace zinf::engine
