// `zinf zero-to-fp32`: DeepSpeed's zero_to_fp32.py without its failures. Reads a ZeRO
// checkpoint folder (stages 0-3, DeepSpeed's or zinf's) and writes the consolidated weights as
// Hugging Face named torch .bin or safetensors files, streaming (consolidate).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace zinf::tools {

struct ZeroToFp32Options {
  std::string checkpoint_dir;
  std::string output_dir;
  std::string tag;  // empty: `latest`
  bool safe_serialization = false;
  std::string max_shard_size = "5GB";
  bool exclude_frozen = false;
  std::string dtype = "fp32";
  int threads = 0;                  // 0: min(hardware threads, 8)
  std::string chunk_size = "8MiB";  // output bytes gathered per work item
  bool quiet = false;
  bool overwrite = false;  // replace an earlier export in output_dir (else refuse it)
  bool verify = true;      // check the CRC-32 of every checkpoint record read
};

// Runs the conversion, printing progress and the summary; throws on any error (see
// consolidate/checkpoint_plan.h and consolidate_writer.h).
void run_zero_to_fp32(const ZeroToFp32Options& options);

// Registers the subcommand; its callback sets exit_code (0; 2 with one line on stderr for an
// earlier export in the output folder without --overwrite; 1 with one line for any other
// error).
void add_zero_to_fp32_command(CLI::App& app, int& exit_code);

}  // namespace zinf::tools
