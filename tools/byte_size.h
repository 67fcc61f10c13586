// Parsing and printing of byte counts as users type them on the command line.
//
// "4096", "512K", "1M", "8MiB", "2G", "1.5G", "1e9" are accepted. K/M/G/T and KiB/MiB/GiB/TiB
// are binary (2^10 steps, as DeepSpeed's ds_io reads them); KB/MB/GB/TB are decimal (10^3
// steps, as fio's and DeepSpeed's "5GB" shard sizes read them). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zinf::tools {

// Throws std::invalid_argument naming `what` (e.g. "--size") and the text on bad input:
// empty, negative, unknown suffix, a fraction of a byte, or a value beyond 2^63.
[[nodiscard]] uint64_t parse_byte_size(std::string_view text, std::string_view what);

// "1 MiB", "8 MiB", "1.50 GiB", "512 B": the largest binary unit that keeps the value ≥ 1,
// when the value is exact in it with at most two decimals; otherwise bytes ("4095 B").
[[nodiscard]] std::string format_bytes(uint64_t bytes);

}  // namespace zinf::tools
