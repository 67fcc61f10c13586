// The subcommands of the zinf binary. Each add_* registers its options on the app and
// returns the exit code holder its callback fills; the library functions do the work
// (tools/io_job.h, tools/nvme_tune.h), these functions only parse, print and report.
#pragma once

#include <CLI/CLI.hpp>

namespace zinf::tools {

// `zinf io`: DeepSpeed ds_io's equivalent.
void add_io_command(CLI::App& app, int& exit_code);
// `zinf nvme-tune`: DeepSpeed ds_nvme_tune's equivalent.
void add_nvme_tune_command(CLI::App& app, int& exit_code);
// Text printed by `zinf --version`: version, build, aio backends, SIMD level, CUDA devices.
// `cuda_compute_unavailable` says why `zinf train` cannot compute on CUDA here (empty: it
// can); the caller asks the engine, which this LibTorch-free library does not link.
std::string version_text(const std::string& cuda_compute_unavailable);

}  // namespace zinf::tools
