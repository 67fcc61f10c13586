// `zinf --version`: what this binary was built with and what it finds on this machine.

#include <fmt/format.h>

#include <string>

#include "aio/handle.h"
#include "optimizer_cpu/simd_level.h"
#include "tools/commands.h"

#ifdef ZINF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef ZINF_VERSION
#define ZINF_VERSION "unknown"
#endif

namespace zinf::tools {
namespace {

std::string backend_status(aio::BackendKind kind) {
  try {
    aio::AioConfig config;
    config.backend = kind;
    aio::AioHandle probe(config);
    return "available";
  } catch (const std::exception& e) {
    return fmt::format("unavailable ({})", e.what());
  }
}

std::string cuda_status() {
#ifdef ZINF_HAVE_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  std::string built =
      fmt::format("built with CUDA runtime {}.{}", runtime / 1000, (runtime % 1000) / 10);
  if (err != cudaSuccess) {
    return fmt::format("{}; no usable device: {}", built, cudaGetErrorString(err));
  }
  return fmt::format("{}; {} device{}", built, devices, devices == 1 ? "" : "s");
#else
  return "not built (CUDA toolkit not found at configure time)";
#endif
}

}  // namespace

std::string version_text(const std::string& cuda_compute_unavailable) {
  std::string text = fmt::format("zinf {}\n", ZINF_VERSION);
  for (auto kind :
       {aio::BackendKind::kIoUring, aio::BackendKind::kLibaio, aio::BackendKind::kPsync}) {
    text += fmt::format("aio backend {}: {}\n", aio::to_string(kind), backend_status(kind));
  }
  std::string levels;
  for (auto level : optimizer_cpu::available_simd_levels()) {
    levels += fmt::format("{}{}", levels.empty() ? "" : ", ", optimizer_cpu::to_string(level));
  }
  text += fmt::format("optimizer SIMD: {} (available: {})\n", optimizer_cpu::active_simd_level(),
                      levels);
  text += fmt::format("cuda: {}\n", cuda_status());
  text += fmt::format("cuda compute: {}\n", cuda_compute_unavailable.empty()
                                                ? "yes (zinf train computes on the GPU)"
                                                : "no: " + cuda_compute_unavailable);
  return text;
}

}  // namespace zinf::tools
