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
#include <string>
#include <vector>

#include "aio/config.h"

namespace zinf::tools {

// Parses `root["aio"]` of a whole config (a missing or null block gives the defaults).
// Unknown keys inside the block are an error (typos must not pass silently).
[[nodiscard]] aio::AioConfig aio_config_from_json(const nlohmann::ordered_json& root);

// The block as DeepSpeed writes it (intra_op_parallelism, not thread_count) plus `backend`.
[[nodiscard]] nlohmann::ordered_json aio_config_to_json(const aio::AioConfig& config);

// Checks the config file `path` that write_aio_block() will change, before any tuning run,
// with the rules of the training config parser (engine/config): invalid JSON, a wrong type
// or value anywhere, `use_gds: true`, and any key of the `aio` block the parser does not know
// (a typo such as `queue_dept`, named with the nearest known key: the rewritten block would
// silently drop it) are errors. A missing file is an error unless `create`. Returns the
// parser's warnings about other blocks (unknown keys elsewhere), for the caller to print.
// Throws std::invalid_argument naming the path and the key.
[[nodiscard]] std::vector<std::string> check_config_for_aio_block(const std::string& path,
                                                                  bool create);

// Replaces (or adds) the `aio` block of the config file at `path`. Only the text of the
// block's value changes: every other byte of the file (other keys, their order, number
// spellings such as 1e-4, comments of layout) stays as it was. A missing file is created
// holding just the block when `create`, and is an error otherwise. The file is replaced
// atomically (temp file + fsync + rename, keeping its mode). Throws std::runtime_error naming
// the path on I/O or JSON errors; the file is then unchanged.
void write_aio_block(const std::string& path, const aio::AioConfig& config, bool create);

}  // namespace zinf::tools
