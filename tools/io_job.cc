#include "tools/io_job.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <utility>

#include "aio/backend.h"
#include "aio/handle.h"
#include "aio/pinned_buffer.h"
#include "tools/byte_size.h"
#include "tools/interrupt.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;

// Transfers in flight at once: while one completes and is checked or refilled, the others
// keep every worker's queue full.
constexpr int kRingSlots = 4;
constexpr uint64_t kAlign = 4096;
constexpr const char* kFolderFile = "zinf-io.dat";

// A position-dependent pattern: word i of the file holds mix(i), so any corruption,
// misplaced block or stale data shows up, and a file can be checked without keeping a copy.
uint64_t pattern_word(uint64_t index) {
  uint64_t z = index + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `data` with the pattern of file bytes [file_offset, file_offset + bytes);
// file_offset is a multiple of 8 (chunks start on 4096-byte multiples).
void fill_pattern(std::byte* data, uint64_t file_offset, uint64_t bytes) {
  const uint64_t first = file_offset / 8;
  const uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = pattern_word(first + i);
    std::memcpy(data + i * 8, &w, 8);
  }
  uint64_t w = pattern_word(first + words);
  std::memcpy(data + words * 8, &w, bytes % 8);
}

// Throws naming the file and the first offset whose byte differs from the pattern.
void check_pattern(const std::string& file, const std::byte* data, uint64_t file_offset,
                   uint64_t bytes) {
  const uint64_t first = file_offset / 8;
  const uint64_t words = (bytes + 7) / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = pattern_word(first + i);
    const uint64_t n = std::min<uint64_t>(8, bytes - i * 8);
    if (std::memcmp(data + i * 8, &w, n) == 0) continue;
    for (uint64_t b = 0; b < n; ++b) {
      if (data[i * 8 + b] != reinterpret_cast<const std::byte*>(&w)[b]) {
        throw std::runtime_error(
            fmt::format("{}: validation failed: byte at offset {} differs from what was written",
                        file, file_offset + i * 8 + b));
      }
    }
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

// The size of a block device (st_size is 0 for them).
uint64_t block_device_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument(fmt::format("{}: cannot open the block device to read its size: {}",
                                            path, std::strerror(errno)));
  }
  uint64_t bytes = 0;
  int rc = ::ioctl(fd, BLKGETSIZE64, &bytes);
  int error = errno;
  ::close(fd);
  if (rc != 0) {
    throw std::invalid_argument(
        fmt::format("{}: BLKGETSIZE64 failed: {}", path, std::strerror(error)));
  }
  return bytes;
}

// For a path that does not exist: its folder must. Names the first component that is in
// the way (a file where a folder should be) or the folder that is missing.
void check_parent_folder(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  for (fs::path at = parent;; at = at.parent_path()) {
    if (at.empty()) at = ".";
    struct stat st {};
    if (::stat(at.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        throw std::invalid_argument(fmt::format("{}: {} is not a folder", path, at.string()));
      }
      if (at == parent) return;
      throw std::invalid_argument(
          fmt::format("{}: the folder {} does not exist", path, parent.string()));
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      throw std::invalid_argument(fmt::format("{}: {}", at.string(), std::strerror(errno)));
    }
    if (at == "." || at == at.parent_path()) {
      throw std::invalid_argument(
          fmt::format("{}: the folder {} does not exist", path, parent.string()));
    }
  }
}

// The job will write `file` (creating it in `folder` when new): say now, before any output,
// when it cannot, rather than fail later "opening for writing".
void check_writable(const std::string& file, bool exists, const std::string& why) {
  fs::path target = exists ? fs::path(file) : fs::path(file).parent_path();
  if (target.empty()) target = ".";
  if (::access(target.c_str(), W_OK) == 0) return;
  if (errno == EROFS) {
    throw std::invalid_argument(
        fmt::format("{}: {}, but {} is on a read-only filesystem", file, why, target.string()));
  }
  throw std::invalid_argument(fmt::format("{}: {}, but {} is not writable: {}", file, why,
                                          target.string(), std::strerror(errno)));
}

// The job writes `file` up to `size_bytes`: its filesystem must have room for what that adds
// (a file that exists already holds `existing_bytes` of it). Checked with statvfs on the file,
// or on its folder when it does not exist yet.
uint64_t check_free_space(const std::string& file, bool exists, uint64_t existing_bytes,
                          uint64_t size_bytes) {
  const uint64_t grow = size_bytes > existing_bytes ? size_bytes - existing_bytes : 0;
  if (grow == 0) return 0;
  fs::path target = exists ? fs::path(file) : fs::path(file).parent_path();
  if (target.empty()) target = ".";
  struct statvfs vfs {};
  if (::statvfs(target.c_str(), &vfs) != 0) {
    throw std::invalid_argument(fmt::format("{}: cannot read the free space of {}: {}", file,
                                            target.string(), std::strerror(errno)));
  }
  const uint64_t free_bytes =
      static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
  if (grow > free_bytes) {
    const auto gib = [](uint64_t bytes) { return static_cast<double>(bytes) / 0x1p30; };
    throw NotEnoughSpace(fmt::format(
        "{}: the job writes {} bytes ({:.2f} GiB) but its filesystem has {} bytes ({:.2f} GiB) "
        "free; lower --size or give a folder on a drive with room",
        file, grow, gib(grow), free_bytes, gib(free_bytes)));
  }
  return grow;
}

uint64_t physical_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

using ChunkFn = std::function<void(std::byte* data, uint64_t file_offset, uint64_t bytes)>;

// Moves file bytes [0, size) through the ring: one transfer per chunk, up to ring_slots in
// flight. `before` runs on a chunk's memory before it is submitted, `after` once it has
// completed. A SIGINT/SIGTERM is honoured between chunks (Interrupted, naming `phase`). On
// any error every transfer still in flight is waited for before the exception leaves (the
// ring must outlive them).
void stream(aio::AioHandle& handle, const IoPlan& plan, std::byte* ring, uint64_t size, bool write,
            const ChunkFn& before, const ChunkFn& after, const std::string& phase) {
  struct InFlight {
    uint64_t ticket = 0;  // 0: the slot is free
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  const auto slots = static_cast<uint64_t>(plan.ring_slots);
  std::vector<InFlight> flight(slots);
  auto memory = [&](uint64_t slot) { return ring + slot * plan.chunk_bytes; };
  auto retire = [&](uint64_t slot) {
    InFlight done = std::exchange(flight[slot], InFlight{});
    if (done.ticket == 0) return;
    handle.wait_for(done.ticket);
    if (after) after(memory(slot), done.offset, done.bytes);
  };
  try {
    uint64_t k = 0;
    for (uint64_t offset = 0; offset < size; offset += plan.chunk_bytes, ++k) {
      const uint64_t slot = k % slots;
      retire(slot);
      if (int sig = interrupt_signal(); sig != 0) {
        throw Interrupted(sig, fmt::format("{} ({} of {}) stopped at offset {}", phase,
                                           write ? "write" : "read", plan.file, offset));
      }
      const uint64_t bytes = std::min(plan.chunk_bytes, size - offset);
      if (before) before(memory(slot), offset, bytes);
      uint64_t ticket = write ? handle.async_pwrite(memory(slot), bytes, plan.file, offset)
                              : handle.async_pread(memory(slot), bytes, plan.file, offset);
      flight[slot] = {ticket, offset, bytes};
    }
    for (uint64_t i = 0; i < slots; ++i) retire((k + i) % slots);  // oldest first
  } catch (...) {
    try {
      handle.wait();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
}

}  // namespace

IoPlan plan_io_job(const IoJob& job) {
  if (job.loops < 1) {
    throw std::invalid_argument(fmt::format("--loops must be at least 1, got {}", job.loops));
  }
  if (job.size_bytes == 0) throw std::invalid_argument("--size must be at least 1 byte");
  if (job.path.empty()) throw std::invalid_argument("no path given");
  job.aio.validate();
  if (job.aio.block_size > aio::kMaxRequestBytes) {
    throw std::invalid_argument(fmt::format(
        "block size {} is above the largest request the aio engine submits, {}; use at most {}",
        format_bytes(job.aio.block_size), format_bytes(aio::kMaxRequestBytes),
        format_bytes(aio::kMaxRequestBytes)));
  }

  IoPlan plan;
  struct stat st {};
  if (::stat(job.path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    plan.in_folder = true;
    plan.file = (fs::path(job.path) / kFolderFile).string();
    if (::stat(plan.file.c_str(), &st) == 0) {
      if (!S_ISREG(st.st_mode)) {
        throw std::invalid_argument(fmt::format(
            "{}: exists and is not a file; zinf io uses this name in a folder", plan.file));
      }
      plan.target = IoPlan::Target::kFile;
      plan.existing_bytes = static_cast<uint64_t>(st.st_size);
    }
  } else if (::stat(job.path.c_str(), &st) == 0) {
    plan.file = job.path;
    if (S_ISREG(st.st_mode)) {
      plan.target = IoPlan::Target::kFile;
      plan.existing_bytes = static_cast<uint64_t>(st.st_size);
    } else if (S_ISBLK(st.st_mode)) {
      plan.target = IoPlan::Target::kBlockDevice;
      plan.existing_bytes = block_device_bytes(job.path);
    } else if (S_ISCHR(st.st_mode)) {
      throw std::invalid_argument(fmt::format(
          "{} is a character device (like /dev/null or /dev/zero): its reads and writes reach "
          "no drive, so there is nothing to time; give a file, a folder or a block device",
          job.path));
    } else {
      throw std::invalid_argument(
          fmt::format("{} is not a file, folder or block device (a FIFO or socket?)", job.path));
    }
  } else if (errno == ENOENT || errno == ENOTDIR) {
    check_parent_folder(job.path);
    plan.file = job.path;
  } else {
    throw std::invalid_argument(fmt::format("{}: {}", job.path, std::strerror(errno)));
  }

  // What the job may write. zinf-io.dat in a folder and a file the job creates are its own.
  const bool own_file = plan.in_folder || plan.target == IoPlan::Target::kNewFile;
  const bool exists = plan.target != IoPlan::Target::kNewFile;
  const char* what = plan.target == IoPlan::Target::kBlockDevice ? "block device" : "file";
  if (job.write) {
    if (!own_file && !job.overwrite) {
      throw std::invalid_argument(fmt::format(
          "{} exists: a write benchmark would overwrite its first {} bytes; pass --overwrite "
          "to allow that, or give a folder (zinf io then uses its own {} there)",
          plan.file, job.size_bytes, kFolderFile));
    }
    if (plan.target == IoPlan::Target::kBlockDevice && plan.existing_bytes < job.size_bytes) {
      throw std::invalid_argument(
          fmt::format("{}: the block device holds {} bytes, fewer than --size {}", plan.file,
                      plan.existing_bytes, job.size_bytes));
    }
    check_writable(plan.file, exists, "a write benchmark writes it");
  } else if (own_file) {
    plan.prepare = !exists || job.validate || plan.existing_bytes < job.size_bytes;
    if (plan.prepare) {
      check_writable(plan.file, exists,
                     "a read benchmark first writes the data it reads (untimed)");
    }
  } else {
    if (plan.existing_bytes == 0) {
      throw std::invalid_argument(fmt::format(
          "{}: the {} is empty; a read benchmark never writes to a {} it did not create: "
          "give a file that holds data, or a folder (zinf io then writes its own {} there)",
          plan.file, what, what, kFolderFile));
    }
    if (plan.existing_bytes < job.size_bytes) {
      throw std::invalid_argument(fmt::format(
          "{}: the {} holds {} bytes, fewer than --size {}; a read benchmark never writes "
          "to a {} it did not create: use --size {} or less, or give a folder (zinf io then "
          "writes its own {} there)",
          plan.file, what, plan.existing_bytes, job.size_bytes, what, plan.existing_bytes,
          kFolderFile));
    }
    if (job.validate) {
      if (!job.overwrite) {
        throw std::invalid_argument(fmt::format(
            "{} exists: --validate first writes a test pattern over its first {} bytes; pass "
            "--overwrite to allow that, or read without --validate",
            plan.file, job.size_bytes));
      }
      plan.prepare = true;
      check_writable(plan.file, exists, "--validate writes a test pattern into it");
    }
  }

  if ((job.write || plan.prepare) && plan.target != IoPlan::Target::kBlockDevice) {
    plan.grow_bytes = check_free_space(plan.file, exists, plan.existing_bytes, job.size_bytes);
  }

  // The ring of pinned buffers.
  // The ring holds what the engine keeps in flight (block x queue depth x threads, fio's own
  // footprint), cut into kRingSlots chunks so that a finished chunk is refilled while the
  // others are still in flight. Measured on tmpfs (1 GiB reads, 1M blocks, queue depth 8):
  // a ring of 3 and of 8 whole in-flight sets ran at 0.89 and 0.73 of fio; memory traffic
  // grows with the footprint.
  const uint64_t in_flight_bytes = job.aio.block_size * static_cast<uint64_t>(job.aio.queue_depth) *
                                   static_cast<uint64_t>(job.aio.intra_op_parallelism);
  const uint64_t blocks_in_flight = in_flight_bytes / job.aio.block_size;
  plan.chunk_bytes = job.aio.block_size *
                     std::max<uint64_t>(1, blocks_in_flight / static_cast<uint64_t>(kRingSlots));
  const uint64_t chunks = (job.size_bytes + plan.chunk_bytes - 1) / plan.chunk_bytes;
  plan.ring_holds_all = chunks <= static_cast<uint64_t>(kRingSlots);
  plan.ring_slots = static_cast<int>(std::min<uint64_t>(chunks, kRingSlots));
  plan.ring_bytes = plan.ring_holds_all ? (job.size_bytes + kAlign - 1) / kAlign * kAlign
                                        : plan.chunk_bytes * static_cast<uint64_t>(kRingSlots);
  const uint64_t memory = physical_memory_bytes();
  if (memory != 0 && plan.ring_bytes > memory / 2) {
    throw std::invalid_argument(fmt::format(
        "the job would pin {} ({} transfers of block size {} x queue depth {} x {} threads), "
        "more than half of this machine's {} of memory; lower --block-size, --queue-depth or "
        "--io-parallel",
        format_bytes(plan.ring_bytes), plan.ring_slots, format_bytes(job.aio.block_size),
        job.aio.queue_depth, job.aio.intra_op_parallelism, format_bytes(memory)));
  }
  return plan;
}

namespace {

IoJobResult run_planned_job(const IoJob& job, const IoPlan& plan,
                            const std::function<void(int, const IoLoop&)>& on_loop);

}  // namespace

IoJobResult run_io_job(const IoJob& job, const std::function<void(int, const IoLoop&)>& on_loop) {
  const IoPlan plan = plan_io_job(job);
  try {
    return run_planned_job(job, plan, on_loop);
  } catch (const Interrupted& e) {
    // The file is gone by now when it was the job's own (see Cleanup below).
    const bool removed = plan.in_folder || plan.target == IoPlan::Target::kNewFile;
    throw Interrupted(
        e.signal_number(),
        fmt::format("zinf io: {}; in-flight I/O drained, {}", e.what(),
                    removed ? fmt::format("{} removed", plan.file)
                    : job.write || plan.prepare
                        ? fmt::format("{} left partly overwritten (--overwrite)", plan.file)
                        : fmt::format("{} left as it was", plan.file)));
  }
}

namespace {

IoJobResult run_planned_job(const IoJob& job, const IoPlan& plan,
                            const std::function<void(int, const IoLoop&)>& on_loop) {
  const uint64_t size = job.size_bytes;
  IoJobResult result;
  result.file = plan.file;
  result.created_file = plan.target == IoPlan::Target::kNewFile;

  // zinf-io.dat goes after the job unless kept; a file the job created goes when the job
  // fails (it holds a partial pattern, nothing of the user's).
  bool completed = false;
  struct Cleanup {
    const IoPlan& plan;
    const IoJob& job;
    const bool& completed;
    ~Cleanup() {
      bool remove = plan.in_folder ? (!job.keep_file || !completed)
                                   : (plan.target == IoPlan::Target::kNewFile && !completed);
      if (remove) ::unlink(plan.file.c_str());
    }
  } cleanup{plan, job, completed};
  if (int sig = interrupt_signal(); sig != 0) {
    throw Interrupted(sig, fmt::format("stopped before the first request to {}", plan.file));
  }

  // The ring outlives the handle: a registered buffer must stay mapped until the rings
  // that hold it are gone, and the handle's destructor waits for what is in flight.
  aio::PinnedBuffer ring;
  try {
    ring = aio::PinnedBuffer(plan.ring_bytes);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(fmt::format("cannot allocate the job's {} of pinned buffers",
                                         format_bytes(plan.ring_bytes)));
  }
  result.pinned_bytes = ring.capacity();
  aio::AioHandle handle(job.aio);
  if (job.register_buffer && job.aio.backend == aio::BackendKind::kIoUring) {
    std::pair<void*, size_t> range{ring.data(), ring.capacity()};
    result.registered_buffer = handle.register_buffers({&range, 1});
  }

  const ChunkFn fill = [](std::byte* data, uint64_t offset, uint64_t bytes) {
    fill_pattern(data, offset, bytes);
  };
  const ChunkFn clear = [](std::byte* data, uint64_t, uint64_t bytes) {
    std::memset(data, 0, bytes);
  };
  const ChunkFn check = [&](std::byte* data, uint64_t offset, uint64_t bytes) {
    check_pattern(plan.file, data, offset, bytes);
  };
  // When the ring holds the whole size, chunk k sits at ring offset k x chunk = its file
  // offset: the pattern is generated and checked once, outside the timed loops. Otherwise
  // it is generated and checked chunk by chunk as the ring turns over.
  if (plan.ring_holds_all) {
    if (job.write || plan.prepare) fill_pattern(ring.data(), 0, size);
  } else if (job.write && !job.validate) {
    fill_pattern(ring.data(), 0, plan.ring_bytes);  // any data will do
  }
  auto read_and_check = [&] {
    if (plan.ring_holds_all) {
      std::memset(ring.data(), 0, size);
      stream(handle, plan, ring.data(), size, false, {}, {}, "reading back for --validate");
      check_pattern(plan.file, ring.data(), 0, size);
    } else {
      stream(handle, plan, ring.data(), size, false, clear, check, "reading back for --validate");
    }
  };

  if (plan.prepare) {
    stream(handle, plan, ring.data(), size, true, plan.ring_holds_all ? ChunkFn{} : fill, {},
           "writing the data to read");
    result.prepared_file = true;
  }

  ChunkFn before;
  ChunkFn after;
  if (job.validate && !plan.ring_holds_all) {
    before = job.write ? fill : clear;
    if (!job.write) after = check;
  }
  std::vector<double> seconds;
  for (int i = 0; i < job.loops; ++i) {
    if (!job.write && job.validate && plan.ring_holds_all) std::memset(ring.data(), 0, size);
    auto start = std::chrono::steady_clock::now();
    stream(handle, plan, ring.data(), size, job.write, before, after,
           fmt::format("loop {} of {}", i + 1, job.loops));
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    IoLoop loop = make_loop(size, elapsed.count());
    result.loops.push_back(loop);
    seconds.push_back(loop.seconds);
    if (!job.write && job.validate && plan.ring_holds_all) {
      check_pattern(plan.file, ring.data(), 0, size);
    }
    if (on_loop) on_loop(i, loop);
  }
  if (job.write && job.validate) read_and_check();
  result.validated = job.validate;

  std::sort(seconds.begin(), seconds.end());
  size_t n = seconds.size();
  double median = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  result.median = make_loop(size, median);
  for (const std::string& p : handle.buffered_paths()) {
    if (p == result.file) result.direct_io = false;
  }
  result.stats = handle.stats();
  handle.close_file(result.file);
  completed = true;
  return result;
}

}  // namespace
}  // namespace zinf::tools
