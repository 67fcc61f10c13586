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
std::string version_text();

}  // namespace zinf::tools
