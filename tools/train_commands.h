// The LibTorch subcommands of the zinf binary (built when ZINF_WITH_TORCH is on): `zinf train`
// (tools/train.h) and `zinf estimate` (tools/estimate.h). Option parsing only.
//
// Thread safety: called once from main() before parsing.
#pragma once

#include <CLI/CLI.hpp>

namespace zinf::tools {

// Adds `train` and `estimate` to `app`; the chosen one's exit code lands in `exit_code`.
void add_train_commands(CLI::App& app, int& exit_code);

}  // namespace zinf::tools
