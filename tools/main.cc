// zinf: one binary, one subcommand per job (see README.md).

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "tools/commands.h"
#include "tools/zero_to_fp32.h"
#ifdef ZINF_WITH_TORCH
#include "engine/cuda_compute.h"
#include "tools/train_commands.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"zinf: ZeRO-Infinity style training runtime and NVMe offload tools", "zinf"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "Print version, aio backends, SIMD level and CUDA devices");
  int exit_code = 0;
  zinf::tools::add_io_command(app, exit_code);
  zinf::tools::add_nvme_tune_command(app, exit_code);
  zinf::tools::add_zero_to_fp32_command(app, exit_code);
#ifdef ZINF_WITH_TORCH
  zinf::tools::add_train_commands(app, exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105 for a failed conversion, 106 for a failed check, ...) are not
    // ours: --help and --version exit 0, every other usage error 2 (README, "Exit codes").
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
#ifdef ZINF_WITH_TORCH
    const std::string no_cuda_compute = zinf::engine::cuda_compute_unavailable_reason();
#else
    const std::string no_cuda_compute = "zinf was built without LibTorch (ZINF_WITH_TORCH=OFF)";
#endif
    fmt::print("{}", zinf::tools::version_text(no_cuda_compute));
    return 0;
  }
  if (app.get_subcommands().empty()) {
    fmt::print("{}", app.help());
    return 2;
  }
  return exit_code;
}
