#include "tools/io_job.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "aio/handle.h"
#include "aio/pinned_buffer.h"

namespace zinf::tools {
namespace {

// A position-dependent pattern: word i of the file holds mix(i), so any corruption,
// misplaced block or stale data shows up, and a file can be checked without keeping a copy.
uint64_t pattern_word(uint64_t index) {
  uint64_t z = index + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_pattern(std::byte* data, uint64_t bytes) {
  uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = pattern_word(i);
    std::memcpy(data + i * 8, &w, 8);
  }
  uint64_t w = pattern_word(words);
  std::memcpy(data + words * 8, &w, bytes % 8);
}

// Returns the first offset whose byte differs from the pattern, or `bytes` when all match.
uint64_t first_mismatch(const std::byte* data, uint64_t bytes) {
  uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = pattern_word(i);
    if (std::memcmp(data + i * 8, &w, 8) != 0) {
      for (uint64_t b = 0; b < 8; ++b) {
        if (data[i * 8 + b] != reinterpret_cast<const std::byte*>(&w)[b]) return i * 8 + b;
      }
    }
  }
  uint64_t w = pattern_word(words);
  for (uint64_t b = 0; b < bytes % 8; ++b) {
    if (data[words * 8 + b] != reinterpret_cast<const std::byte*>(&w)[b]) return words * 8 + b;
  }
  return bytes;
}

void check_pattern(const std::string& file, const std::byte* data, uint64_t bytes) {
  uint64_t at = first_mismatch(data, bytes);
  if (at != bytes) {
    throw std::runtime_error(fmt::format(
        "{}: validation failed: byte at offset {} differs from what was written", file, at));
  }
}

IoLoop make_loop(uint64_t bytes, double seconds) {
  IoLoop loop;
  loop.seconds = seconds;
  if (seconds > 0) {
    loop.gb_per_s = static_cast<double>(bytes) / seconds / 1e9;
    loop.gib_per_s = static_cast<double>(bytes) / seconds / 0x1p30;
  }
  return loop;
}

}  // namespace

IoJobResult run_io_job(const IoJob& job, const std::function<void(int, const IoLoop&)>& on_loop) {
  if (job.loops < 1) throw std::invalid_argument("--loops must be at least 1");
  if (job.size_bytes == 0) throw std::invalid_argument("--size must be at least 1 byte");
  job.aio.validate();

  namespace fs = std::filesystem;
  IoJobResult result;
  std::error_code ec;
  bool in_folder = fs::is_directory(job.path, ec);
  result.file = in_folder ? (fs::path(job.path) / "zinf-io.dat").string() : job.path;
  if (!in_folder) {
    fs::path parent = fs::path(job.path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      throw std::invalid_argument(
          fmt::format("{}: the folder {} does not exist", job.path, parent.string()));
    }
  }
  struct Cleanup {
    std::string file;
    bool active;
    ~Cleanup() {
      if (active) ::unlink(file.c_str());
    }
  } cleanup{result.file, in_folder && !job.keep_file};

  // The buffer outlives the handle: a registered buffer must stay mapped until the rings
  // that hold it are gone.
  aio::PinnedBuffer buffer(job.size_bytes);
  aio::AioHandle handle(job.aio);
  if (job.register_buffer && job.aio.backend == aio::BackendKind::kIoUring) {
    std::pair<void*, size_t> range{buffer.data(), buffer.capacity()};
    result.registered_buffer = handle.register_buffers({&range, 1});
  }

  // A read job needs a file at least `size` long; with --validate it must hold the pattern.
  struct stat st {};
  bool exists = ::stat(result.file.c_str(), &st) == 0;
  bool need_pattern = job.validate || !exists || static_cast<uint64_t>(st.st_size) < job.size_bytes;
  if (job.write || need_pattern) fill_pattern(buffer.data(), job.size_bytes);
  if (!job.write && need_pattern) {
    handle.pwrite(buffer.data(), job.size_bytes, result.file, 0);
    result.prepared_file = true;
  }

  std::vector<double> seconds;
  for (int i = 0; i < job.loops; ++i) {
    if (!job.write && job.validate) std::memset(buffer.data(), 0, job.size_bytes);
    auto start = std::chrono::steady_clock::now();
    if (job.write) {
      handle.pwrite(buffer.data(), job.size_bytes, result.file, 0);
    } else {
      handle.pread(buffer.data(), job.size_bytes, result.file, 0);
    }
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    IoLoop loop = make_loop(job.size_bytes, elapsed.count());
    result.loops.push_back(loop);
    seconds.push_back(loop.seconds);
    if (on_loop) on_loop(i, loop);
    if (!job.write && job.validate) check_pattern(result.file, buffer.data(), job.size_bytes);
  }
  if (job.write && job.validate) {
    aio::PinnedBuffer check(job.size_bytes);
    handle.pread(check.data(), job.size_bytes, result.file, 0);
    check_pattern(result.file, check.data(), job.size_bytes);
  }
  result.validated = job.validate;

  std::sort(seconds.begin(), seconds.end());
  size_t n = seconds.size();
  double median = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  result.median = make_loop(job.size_bytes, median);
  for (const std::string& p : handle.buffered_paths()) {
    if (p == result.file) result.direct_io = false;
  }
  result.stats = handle.stats();
  handle.close_file(result.file);
  return result;
}

}  // namespace zinf::tools
