// Reading and writing the `aio` block of a DeepSpeed JSON config.
//
// Keys and defaults are DeepSpeed's: block_size, queue_depth, intra_op_parallelism (the old
// name thread_count is accepted; both given with different values is an error),
// single_submit, overlap_events, use_gds. zinf adds one key, `backend` ("io_uring",
// "libaio", "psync"), inside the same block: DeepSpeed reads the aio block key by key and
// ignores keys it does not know, so a zinf config stays a valid DeepSpeed config.
// Sizes may be written in exponent form (1e6) as long as they are whole numbers.
//
// Errors: std::invalid_argument whose message names the key ("aio.queue_depth") and the
// offending value. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "aio/config.h"

namespace zinf::tools {

// Parses `root["aio"]` of a whole config (a missing or null block gives the defaults).
// Unknown keys inside the block are an error (typos must not pass silently).
[[nodiscard]] aio::AioConfig aio_config_from_json(const nlohmann::ordered_json& root);

// The block as DeepSpeed writes it (intra_op_parallelism, not thread_count) plus `backend`.
[[nodiscard]] nlohmann::ordered_json aio_config_to_json(const aio::AioConfig& config);

// Replaces (or adds) the `aio` block of the config file at `path`, keeping every other key
// and the key order; a missing file is created holding just the block. The file is
// replaced atomically (temp file + fsync + rename). Throws std::runtime_error naming the
// path on I/O or JSON errors.
void write_aio_block(const std::string& path, const aio::AioConfig& config);

}  // namespace zinf::tools
