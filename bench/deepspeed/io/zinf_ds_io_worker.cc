// zinf_ds_io_worker: zinf's aio engine measured the way DeepSpeed's ds_io measures its own,
// for bench_ds_io.py. One pinned buffer of the whole --size (ds_io's page-locked tensor),
// registered with io_uring as zinf's pinned pools are, and per loop one synchronous
// pread/pwrite of all of it at offset 0 (ds_io's handle.pread/pwrite + wait), which the
// handle cuts into --block-size requests with --queue-depth in flight on one worker thread.
// --warmup untimed loops first, then --loops timed ones; prints one JSON line with each
// timed loop's seconds. Writes create the file when missing and overwrite it in place.
//
//   zinf_ds_io_worker --path FILE --size BYTES [--read] [--block-size 1048576]
//       [--queue-depth 8] [--backend io_uring|libaio|psync] [--loops 3] [--warmup 1]
//
// `zinf io` streams the size through a ring of block size x queue depth instead; the
// driver runs both.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "aio/config.h"
#include "aio/handle.h"
#include "aio/pinned_buffer.h"
#include "bench/deepspeed/worker_main.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string path;
  std::uint64_t size = 0;
  bool read = false;
  aio::AioConfig aio;
  int loops = 3;
  int warmup = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--read") {
      o.read = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(arg + ": missing value");
    const std::string value = argv[++i];
    if (arg == "--path") {
      o.path = value;
    } else if (arg == "--size") {
      o.size = std::stoull(value);
    } else if (arg == "--block-size") {
      o.aio.block_size = std::stoull(value);
    } else if (arg == "--queue-depth") {
      o.aio.queue_depth = std::stoi(value);
    } else if (arg == "--backend") {
      const auto kind = aio::parse_backend(value);
      if (!kind) throw std::invalid_argument("unknown --backend " + value);
      o.aio.backend = *kind;
    } else if (arg == "--loops") {
      o.loops = std::stoi(value);
    } else if (arg == "--warmup") {
      o.warmup = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  if (o.path.empty() || o.size == 0) throw std::invalid_argument("--path and --size are required");
  if (o.loops < 1 || o.warmup < 0) throw std::invalid_argument("--loops >= 1, --warmup >= 0");
  o.aio.validate();
  return o;
}

int run(const Options& o) {
  aio::AioHandle handle(o.aio);
  aio::PinnedBuffer buffer(o.size);
  for (std::uint64_t i = 0; i < o.size; i += 4096) buffer.data()[i] = std::byte{0x5a};  // touched
  const std::pair<void*, std::size_t> range{buffer.data(), buffer.capacity()};
  const bool registered = handle.register_buffers({&range, 1});

  std::vector<double> seconds;
  for (int i = 0; i < o.warmup + o.loops; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (o.read) {
      handle.pread(buffer.data(), o.size, o.path, 0);
    } else {
      handle.pwrite(buffer.data(), o.size, o.path, 0);
    }
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (i >= o.warmup) seconds.push_back(elapsed.count());
  }
  const bool direct = handle.buffered_paths().empty();
  const aio::AioStats stats = handle.stats();
  handle.unregister_buffers({&range, 1});
  handle.close_file(o.path);

  std::printf(
      "{\"backend\": \"%s\", \"direct_io\": %s, \"locked\": %s, \"registered\": %s, "
      "\"requests\": %llu, \"fixed_requests\": %llu, ",
      std::string(handle.backend_name()).c_str(), direct ? "true" : "false",
      buffer.locked() ? "true" : "false", registered ? "true" : "false",
      static_cast<unsigned long long>(stats.requests),
      static_cast<unsigned long long>(stats.fixed_requests));
  print_json_list_and_close("seconds", seconds, 6);
  return 0;
}

}  // namespace
}  // namespace zinf::bench

int main(int argc, char** argv) {
  return zinf::bench::worker_main("zinf_ds_io_worker", argc, argv, zinf::bench::parse,
                                  zinf::bench::run);
}
