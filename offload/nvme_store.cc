#include "offload/nvme_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "aio/error.h"
#include "aio/pinned_buffer.h"
#include "offload/error.h"

namespace zinf::offload {
namespace {

constexpr uint64_t kExtentAlignment = 4096;

uint64_t round_up(uint64_t bytes) {
  return (bytes + kExtentAlignment - 1) / kExtentAlignment * kExtentAlignment;
}

uint64_t hash_of(const void* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

std::string errno_text(int error) { return std::string(std::strerror(error)); }

std::string hex(uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// mkdir that accepts an existing directory; throws kIo otherwise.
// Creates `path` (a directory) unless it exists. Returns 0 or the errno of the failure.
int try_make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    return 0;
  }
  const int error = errno;
  struct stat st {};
  if (error == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return 0;
  }
  return error;
}

// A store's last step at exit removes zinf_swap/ and rank<r>/ when they are empty, so another
// process (or store) may remove a folder between our mkdir and the next step inside it. That
// shows as ENOENT, and the whole sequence is retried this many times.
constexpr int kFolderRaceRetries = 1000;

std::atomic<FallocateFunction> g_fallocate_function{nullptr};

int call_fallocate(int fd, uint64_t offset, uint64_t length) {
  const FallocateFunction seam = g_fallocate_function.load(std::memory_order_acquire);
  if (seam != nullptr) {
    return seam(fd, 0, static_cast<int64_t>(offset), static_cast<int64_t>(length));
  }
  int rc = 0;
  do {
    rc = ::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : -errno;
}

// Undoes the octal escapes (\040 for a space, ...) of a /proc/self/mountinfo field.
std::string unescape_mount_field(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t at) { return field[at] >= '0' && field[at] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

// "ext4 at /mnt/nvme": the type and mount point of the file system holding `path`, from
// /proc/self/mountinfo (the longest mount point containing it); the statfs magic number
// when that file cannot be read.
std::string describe_filesystem(const std::string& path, int fd) {
  std::string resolved = path;
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    resolved = real;
    std::free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath's contract
  }
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  std::string best_point;
  std::string best_type;
  while (std::getline(mountinfo, line)) {
    // id parent major:minor root mount-point options [optional...] - type source super
    std::istringstream fields(line);
    std::string field;
    std::string point;
    for (int i = 0; i < 5 && fields >> field; ++i) {
      point = field;
    }
    while (fields >> field && field != "-") {
    }
    std::string type;
    if (!(fields >> type)) {
      continue;
    }
    point = unescape_mount_field(point);
    const bool contains = point == "/" || resolved == point ||
                          (resolved.compare(0, point.size(), point) == 0 &&
                           resolved.size() > point.size() && resolved[point.size()] == '/');
    if (contains && point.size() >= best_point.size()) {
      best_point = point;
      best_type = type;
    }
  }
  if (!best_type.empty()) {
    return best_type + " at " + best_point;
  }
  struct statfs fs {};
  if (::fstatfs(fd, &fs) == 0) {
    char magic[32];
    std::snprintf(magic, sizeof(magic), "0x%llx",
                  static_cast<unsigned long long>(fs.f_type));  // NOLINT(google-runtime-int)
    return std::string("file system type ") + magic;
  }
  return "unknown file system";
}

}  // namespace

void set_fallocate_function_for_testing(FallocateFunction function) {
  g_fallocate_function.store(function, std::memory_order_release);
}

// ---- Queue ---------------------------------------------------------------------------

NvmeStore::Queue::Queue(NvmeStore& store) : store_(store), lanes_(store.devices_.size()) {
  for (Lane& lane : lanes_) {
    lane.io = make_handle();
  }
}

std::unique_ptr<aio::AioHandle> NvmeStore::Queue::make_handle() const {
  return store_.config_.backend_factory
             ? std::make_unique<aio::AioHandle>(store_.config_.aio, store_.config_.backend_factory)
             : std::make_unique<aio::AioHandle>(store_.config_.aio);
}

aio::AioHandle& NvmeStore::Queue::handle(size_t device) {
  Lane& lane = lanes_[device];
  if (!lane.io) {
    lane.io = make_handle();
    if (!registered_.empty()) {
      (void)lane.io->register_buffers(registered_);  // transfers work either way
    }
  }
  return *lane.io;
}

void NvmeStore::Queue::submit(bool is_write, void* buffer, uint64_t bytes, uint64_t offset,
                              size_t& queued) {
  const size_t n = lanes_.size();
  auto* memory = static_cast<std::byte*>(buffer);
  const auto queue_piece = [&](size_t device, uint64_t piece, uint64_t file_offset) {
    const std::string& path = store_.devices_[device].path;
    if (is_write) {
      handle(device).async_pwrite(memory, piece, path, file_offset);
    } else {
      handle(device).async_pread(memory, piece, path, file_offset);
    }
    ++queued;
  };
  if (n == 1) {
    queue_piece(0, bytes, offset);  // the logical offset is the file offset
    return;
  }
  // Stripe unit k of the logical space lies in file k mod n, at (k div n) * unit.
  const uint64_t unit = store_.config_.stripe_bytes;
  while (bytes > 0) {
    const uint64_t k = offset / unit;
    const uint64_t within = offset % unit;
    const uint64_t piece = std::min(bytes, unit - within);
    queue_piece(static_cast<size_t>(k % n), piece, (k / n) * unit + within);
    memory += piece;
    offset += piece;
    bytes -= piece;
  }
}

NvmeStore::Queue::~Queue() {
  if (pending_.empty()) {
    return;
  }
  try {
    wait();  // never abandon buffers the kernel may still write
  } catch (const std::exception& e) {
    spdlog::error("zinf offload: swap transfers abandoned at queue destruction: {}", e.what());
  }
}

void NvmeStore::Queue::async_read(ExtentId id, void* buffer) {
  uint64_t bytes = 0;
  {
    std::lock_guard lock(store_.mutex_);
    bytes = store_.extents_.size() > id ? store_.extents_[id].info.bytes : 0;
  }
  async_transfer(id, 0, bytes, buffer, /*is_write=*/false);
}

void NvmeStore::Queue::async_write(ExtentId id, const void* buffer) {
  uint64_t bytes = 0;
  {
    std::lock_guard lock(store_.mutex_);
    bytes = store_.extents_.size() > id ? store_.extents_[id].info.bytes : 0;
  }
  async_transfer(id, 0, bytes, const_cast<void*>(buffer), /*is_write=*/true);
}

void NvmeStore::Queue::async_transfer(ExtentId id, uint64_t offset, uint64_t bytes, void* buffer,
                                      bool is_write) {
  Pending pending{id, is_write, buffer, offset, bytes, 0, false, 0};
  {
    std::lock_guard lock(store_.mutex_);
    Extent& extent = store_.checked(id, offset, bytes, is_write ? "write" : "read");
    pending.file_offset = extent.info.file_offset + offset;
    const bool whole = offset == 0 && bytes == extent.info.bytes;
    if (is_write) {
      if (!whole && extent.state != ExtentState::kValid) {
        throw OffloadError(ErrorKind::kUsage,
                           "partial write to an extent without valid contents in " + store_.label_ +
                               " at offset " + std::to_string(extent.info.file_offset));
      }
      store_.reserve_locked(extent.info.file_offset + extent.info.capacity);
      extent.in_flight_write = true;
    } else {
      if (extent.state == ExtentState::kEmpty) {
        throw OffloadError(ErrorKind::kUsage, "read of a never-written extent in " + store_.label_ +
                                                  " at offset " +
                                                  std::to_string(extent.info.file_offset));
      }
      if (extent.state == ExtentState::kTorn) {
        throw OffloadError(ErrorKind::kCorrupt,
                           "extent in swap file " + store_.label_ + " at offset " +
                               std::to_string(extent.info.file_offset) + " (" +
                               std::to_string(extent.info.bytes) +
                               " bytes) is torn: its last write did not complete");
      }
      if (store_.config_.checksums && whole) {
        pending.verify = true;
        pending.checksum = extent.checksum;
      }
    }
  }
  if (is_write && store_.config_.checksums) {
    pending.checksum = hash_of(buffer, bytes);  // the source must stay untouched until wait
  }
  pending_.push_back(pending);
  size_t queued = 0;
  try {
    submit(is_write, buffer, bytes, pending.file_offset, queued);
  } catch (const std::exception& e) {
    if (queued > 0) {  // some pieces are in flight already: wait() must collect them
      if (!submit_error_) {
        submit_error_ = "queueing a transfer on swap file(s) " + store_.label_ + " at offset " +
                        std::to_string(pending.file_offset) + " failed: " + e.what();
      }
      return;
    }
    pending_.pop_back();
    if (is_write) {
      std::lock_guard lock(store_.mutex_);
      store_.extents_[id].in_flight_write = false;
    }
    throw;
  }
}

void NvmeStore::Queue::wait() {
  std::optional<OffloadError> error;
  if (submit_error_) {
    error.emplace(ErrorKind::kIo, *submit_error_);
    submit_error_.reset();
  }
  uint64_t requests = 0;
  uint64_t fixed_requests = 0;
  bool buffered = false;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (!lane.io) {
      continue;  // replaced after a failure, and nothing queued on it since
    }
    bool failed = false;
    try {
      (void)lane.io->wait();
    } catch (const aio::IoError& e) {
      failed = true;
      std::string message = std::string("I/O error on swap file: ") + e.what();
      if (e.error() == ENOSPC) {
        std::lock_guard lock(store_.mutex_);
        message += store_.devices_[i].no_fallocate
                       ? "; the file system has no fallocate, so the swap file's space could "
                         "not be reserved in advance: free space there or choose another "
                         "nvme_path"
                       : "; the file system is full";
      }
      if (!error) {
        error.emplace(ErrorKind::kIo, message);
      }
    } catch (const std::exception& e) {
      failed = true;
      if (!error) {
        error.emplace(ErrorKind::kIo,
                      "I/O error on swap file " + store_.devices_[i].path + ": " + e.what());
      }
    }
    const aio::AioStats io_stats = lane.io->stats();
    requests += io_stats.requests - lane.reported.requests;
    fixed_requests += io_stats.fixed_requests - lane.reported.fixed_requests;
    lane.reported = io_stats;
    // Whether the file went buffered is known once this handle has opened it.
    if (!lane.checked_buffered && !pending_.empty()) {
      lane.checked_buffered = true;
      buffered = buffered || !lane.io->buffered_paths().empty();
    }
    if (failed) {
      // Whether the engine broke, a request timed out or one request failed cannot be told
      // apart reliably from here: the handle is replaced in every case (it has nothing in
      // flight now), so a broken engine never serves a later transfer.
      spdlog::warn("zinf offload: replacing the aio handle of a queue on {} after an error",
                   store_.devices_[i].path);
      lane = Lane{};
    }
  }
  // Verify reads outside the store's lock: hashing is the expensive part.
  if (!error) {
    for (const Pending& p : pending_) {
      if (p.is_write || !p.verify) {
        continue;
      }
      const uint64_t actual = hash_of(p.buffer, p.bytes);
      if (actual != p.checksum) {
        error.emplace(ErrorKind::kCorrupt,
                      "checksum mismatch in swap file " + store_.label_ + " at offset " +
                          std::to_string(p.file_offset) + " (" + std::to_string(p.bytes) +
                          " bytes): written xxh3 " + hex(p.checksum) + ", read " + hex(actual));
        break;
      }
    }
  }
  {
    std::lock_guard lock(store_.mutex_);
    store_.buffered_ = store_.buffered_ || buffered;
    store_.io_requests_ += requests;
    store_.fixed_io_requests_ += fixed_requests;
    for (const Pending& p : pending_) {
      Extent& extent = store_.extents_[p.id];
      if (p.is_write) {
        extent.in_flight_write = false;
        if (error && error->kind() == ErrorKind::kIo) {
          extent.state = ExtentState::kTorn;  // which write failed is unknown: all suspect
        } else {
          extent.state = ExtentState::kValid;
          if (p.offset == 0 && p.bytes == extent.info.bytes) {
            extent.checksum = p.checksum;
          }
          store_.bytes_written_ += p.bytes;
          ++store_.writes_;
        }
      } else if (!error) {
        store_.bytes_read_ += p.bytes;
        ++store_.reads_;
      }
    }
  }
  pending_.clear();
  if (error) {
    throw *error;
  }
}

bool NvmeStore::Queue::register_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  bool fixed = true;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    fixed = handle(i).register_buffers(ranges) && fixed;
  }
  for (const auto& range : ranges) {
    if (std::find(registered_.begin(), registered_.end(), range) == registered_.end()) {
      registered_.push_back(range);
    }
  }
  return fixed;
}

void NvmeStore::Queue::unregister_buffers(std::span<const std::pair<void*, size_t>> ranges) {
  for (const auto& range : ranges) {
    registered_.erase(std::remove(registered_.begin(), registered_.end(), range),
                      registered_.end());
  }
  for (Lane& lane : lanes_) {
    if (lane.io) {
      lane.io->unregister_buffers(ranges);
    }
  }
}

// ---- NvmeStore -------------------------------------------------------------------------

NvmeStore::NvmeStore(NvmeStoreConfig config) : config_(std::move(config)) {
  std::vector<std::string> folders = config_.nvme_paths;
  if (folders.empty() && !config_.nvme_path.empty()) {
    folders.push_back(config_.nvme_path);
  }
  if (folders.empty()) {
    throw OffloadError(ErrorKind::kConfig, "nvme_path is empty: the nvme device needs a path");
  }
  if (config_.rank < 0) {
    throw OffloadError(ErrorKind::kConfig, "rank " + std::to_string(config_.rank) + " < 0");
  }
  if (config_.stripe_bytes == 0 || config_.stripe_bytes % kExtentAlignment != 0) {
    throw OffloadError(ErrorKind::kConfig, "stripe_bytes " + std::to_string(config_.stripe_bytes) +
                                               " is not a positive multiple of 4096");
  }
  config_.aio.validate();
  devices_.resize(folders.size());
  for (size_t i = 0; i < folders.size(); ++i) {
    Device& device = devices_[i];
    device.nvme_path = folders[i];
    if (device.nvme_path.empty()) {
      throw OffloadError(ErrorKind::kConfig,
                         "nvme_paths[" + std::to_string(i) + "] is empty: give a folder");
    }
    struct stat st {};
    if (::stat(device.nvme_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw OffloadError(ErrorKind::kConfig,
                         "nvme_path " + device.nvme_path + " is not an existing directory");
    }
    for (size_t j = 0; j < i; ++j) {
      struct stat other {};
      if (::stat(devices_[j].nvme_path.c_str(), &other) == 0 && other.st_dev == st.st_dev &&
          other.st_ino == st.st_ino) {
        throw OffloadError(ErrorKind::kConfig, "nvme_paths lists the folder " + device.nvme_path +
                                                   " twice (as " + devices_[j].nvme_path + ")");
      }
    }
    device.directory = device.nvme_path + "/zinf_swap/rank" + std::to_string(config_.rank);
    device.path = device.directory + "/" + config_.name + ".swp";
    device.lock_path = device.directory + "/" + config_.name + ".lock";
    label_ += (i == 0 ? "" : ", ") + device.path;
  }
  try {
    for (Device& device : devices_) {
      take_lock_and_replace_stale(device);
    }
    sync_queue_ = make_queue();
  } catch (...) {
    // No destructor runs for a throwing constructor: leave nothing on disk, except the
    // files of a live process holding a lock (not ours: lock_fd is empty then).
    remove_files();
    throw;
  }
}

NvmeStore::~NvmeStore() {
  sync_queue_.reset();
  remove_files();
}

std::vector<std::string> NvmeStore::paths() const {
  std::vector<std::string> out;
  for (const Device& device : devices_) {
    out.push_back(device.path);
  }
  return out;
}

std::vector<std::string> NvmeStore::directories() const {
  std::vector<std::string> out;
  for (const Device& device : devices_) {
    out.push_back(device.directory);
  }
  return out;
}

void NvmeStore::remove_files() noexcept {
  for (Device& device : devices_) {
    device.file_fd.reset();
    if (!device.lock_fd) {
      // Not ours (another live process holds it) or never taken: only directories we
      // made and left empty go.
      ::rmdir(device.directory.c_str());
      ::rmdir((device.nvme_path + "/zinf_swap").c_str());
      continue;
    }
    ::unlink(device.path.c_str());
    // Unlinked while still locked: a process that opened the old lock file meanwhile finds
    // it unlinked once it gets the lock, and retries (take_lock_and_replace_stale).
    ::unlink(device.lock_path.c_str());
    device.lock_fd.reset();
    // Removed only when empty: other stores (of this process or another) may live there.
    ::rmdir(device.directory.c_str());
    ::rmdir((device.nvme_path + "/zinf_swap").c_str());
  }
}

void NvmeStore::take_lock_and_replace_stale(Device& device) {
  const std::string& lock_path = device.lock_path;
  const std::string& path = device.path;
  const std::string parent = device.nvme_path + "/zinf_swap";
  for (int attempt = 1;; ++attempt) {
    // The folders, then the lock file in them (which keeps rank<r>/ from being removed as
    // empty); a folder removed meanwhile by another store's exit shows as ENOENT: again.
    const bool may_retry = attempt < kFolderRaceRetries;
    for (const std::string& folder : {parent, device.directory}) {
      const int error = try_make_directory(folder);
      if (error == ENOENT && may_retry) {
        break;
      }
      if (error != 0) {
        throw OffloadError(ErrorKind::kIo,
                           "cannot create swap directory " + folder + ": " + errno_text(error));
      }
    }
    aio::UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) {
      const int error = errno;
      if (error == ENOENT && may_retry) {
        continue;
      }
      throw OffloadError(ErrorKind::kIo,
                         "cannot open swap lock file " + lock_path + ": " + errno_text(error));
    }
    int rc = 0;
    do {
      rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      throw OffloadError(ErrorKind::kIo, "swap file " + path +
                                             " is in use by another live process (lock " +
                                             lock_path + ": " + errno_text(error) +
                                             "); give each run its own nvme_path or rank");
    }
    // The lock is ours only if the file we locked is still the one at lock_path: its
    // previous owner unlinks it at exit, possibly between our open and our flock.
    struct stat locked {};
    struct stat current {};
    if (::fstat(fd.get(), &locked) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "fstat of swap lock file " + lock_path + " failed: " + errno_text(errno));
    }
    if (::stat(lock_path.c_str(), &current) == 0 && current.st_dev == locked.st_dev &&
        current.st_ino == locked.st_ino) {
      device.lock_fd = std::move(fd);
      break;
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    replaced_stale_ = true;
    spdlog::warn(
        "zinf offload: {} ({} bytes) is left over from a run that did not exit cleanly; "
        "replacing it",
        path, static_cast<uint64_t>(st.st_size));
    if (::unlink(path.c_str()) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "cannot remove stale swap file " + path + ": " + errno_text(errno));
    }
  }
  device.file_fd =
      aio::UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!device.file_fd) {
    throw OffloadError(ErrorKind::kIo,
                       "cannot create swap file " + path + ": " + errno_text(errno));
  }
}

NvmeStore::Extent& NvmeStore::checked(ExtentId id, uint64_t offset, uint64_t bytes,
                                      const char* op) {
  if (id >= extents_.size() || extents_[id].state == ExtentState::kFree) {
    throw OffloadError(ErrorKind::kUsage, std::string(op) + " of unknown extent id " +
                                              std::to_string(id) + " in " + label_);
  }
  Extent& extent = extents_[id];
  if (offset > extent.info.bytes || bytes > extent.info.bytes - offset) {
    throw OffloadError(ErrorKind::kUsage,
                       std::string(op) + " of " + std::to_string(bytes) + " bytes at " +
                           std::to_string(offset) + " exceeds the extent's " +
                           std::to_string(extent.info.bytes) + " bytes in " + label_);
  }
  if (extent.in_flight_write) {
    throw OffloadError(ErrorKind::kUsage, std::string(op) + " of extent at offset " +
                                              std::to_string(extent.info.file_offset) + " in " +
                                              label_ + " while a write to it is in flight");
  }
  return extent;
}

ExtentId NvmeStore::allocate(uint64_t bytes) {
  if (bytes == 0) {
    throw OffloadError(ErrorKind::kUsage, "extent of 0 bytes requested in " + label_);
  }
  const uint64_t capacity = round_up(bytes);
  std::lock_guard lock(mutex_);
  uint64_t offset = end_;
  for (auto it = free_spans_.begin(); it != free_spans_.end(); ++it) {
    if (it->second >= capacity) {
      offset = it->first;
      const uint64_t rest = it->second - capacity;
      free_spans_.erase(it);
      if (rest > 0) {
        free_spans_.emplace(offset + capacity, rest);
      }
      break;
    }
  }
  if (offset == end_) {
    end_ += capacity;
  }
  Extent extent;
  extent.info = {offset, bytes, capacity};
  extent.state = ExtentState::kEmpty;
  extents_.push_back(extent);
  return static_cast<ExtentId>(extents_.size() - 1);
}

void NvmeStore::free(ExtentId id) {
  std::lock_guard lock(mutex_);
  Extent& extent = checked(id, 0, 0, "free");
  extent.state = ExtentState::kFree;
  uint64_t offset = extent.info.file_offset;
  uint64_t capacity = extent.info.capacity;
  // Merge with the neighbouring free spans.
  auto next = free_spans_.lower_bound(offset);
  if (next != free_spans_.end() && next->first == offset + capacity) {
    capacity += next->second;
    next = free_spans_.erase(next);
  }
  if (next != free_spans_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      capacity += prev->second;
      free_spans_.erase(prev);
    }
  }
  if (offset + capacity < end_) {
    free_spans_.emplace(offset, capacity);
    return;
  }
  // The free span is the tail: the allocated span ends before it, so later space checks no
  // longer count it, and its reserved bytes go back to the file system.
  end_ = offset;
  if (reserved_ > end_) {
    shrink_files_locked(end_);
  }
}

ExtentInfo NvmeStore::extent(ExtentId id) const {
  std::lock_guard lock(mutex_);
  if (id >= extents_.size() || extents_[id].state == ExtentState::kFree) {
    throw OffloadError(ErrorKind::kUsage,
                       "unknown extent id " + std::to_string(id) + " in " + label_);
  }
  return extents_[id].info;
}

void NvmeStore::reserve() {
  std::lock_guard lock(mutex_);
  reserve_locked(end_);
}

uint64_t NvmeStore::device_bytes(size_t device, uint64_t logical_end) const noexcept {
  const uint64_t n = devices_.size();
  if (n == 1) {
    return logical_end;
  }
  const uint64_t unit = config_.stripe_bytes;
  const uint64_t row = unit * n;
  const uint64_t rest = logical_end % row;
  const uint64_t start = unit * device;  // of this device's unit in the last, partial row
  return logical_end / row * unit + (rest > start ? std::min(rest - start, unit) : 0);
}

void NvmeStore::shrink_files_locked(uint64_t logical_end) noexcept {
  bool all = true;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const uint64_t bytes = device_bytes(i, logical_end);
    if (::ftruncate(devices_[i].file_fd.get(), static_cast<off_t>(bytes)) != 0) {
      all = false;  // the bytes stay reserved for later extents: harmless
      spdlog::warn("zinf offload: shrinking swap file {} to {} bytes failed: {}", devices_[i].path,
                   bytes, errno_text(errno));
    }
  }
  if (all) {
    reserved_ = logical_end;
  }
}

void NvmeStore::reserve_locked(uint64_t needed_end) {
  if (needed_end <= reserved_ || end_ <= reserved_) {
    return;  // already reserved: nothing can take this space any more
  }
  // Everything allocated at once when it fits (one fallocate per file, and a full disk shows
  // up at the first write); else only what this transfer needs, so one allocation that does
  // not fit does not stop the extents that do.
  std::string failure;
  if (try_reserve_locked(end_, failure)) {
    return;
  }
  if (needed_end < end_ && try_reserve_locked(needed_end, failure)) {
    return;
  }
  throw OffloadError(ErrorKind::kSpace, "not enough free space for swap file " + failure);
}

bool NvmeStore::try_reserve_locked(uint64_t target, std::string& failure) {
  const size_t n = devices_.size();
  // Free space per file system, shared by the folders on one of them.
  std::vector<uint64_t> needed(n);
  std::vector<uint64_t> free_bytes(n);
  std::vector<dev_t> fs_of(n);
  for (size_t i = 0; i < n; ++i) {
    const Device& device = devices_[i];
    needed[i] = device_bytes(i, target) - device_bytes(i, reserved_);
    struct statvfs fs {};
    struct stat st {};
    if (::fstatvfs(device.file_fd.get(), &fs) != 0 || ::fstat(device.file_fd.get(), &st) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "statvfs of swap file " + device.path + " failed: " + errno_text(errno));
    }
    free_bytes[i] = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    fs_of[i] = st.st_dev;
  }
  for (size_t i = 0; i < n; ++i) {
    uint64_t shared = 0;  // needed on i's file system, by every folder on it
    for (size_t j = 0; j < n; ++j) {
      shared += fs_of[j] == fs_of[i] ? needed[j] : 0;
    }
    if (shared > free_bytes[i]) {
      failure = devices_[i].path + ": needs " + std::to_string(shared) + " more bytes (" +
                std::to_string(device_bytes(i, target)) + " in total), the file system has " +
                std::to_string(free_bytes[i]) + " bytes free";
      return false;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    Device& device = devices_[i];
    const uint64_t from = device_bytes(i, reserved_);
    const uint64_t to = device_bytes(i, target);
    if (to == from) {
      continue;
    }
    const int rc = call_fallocate(device.file_fd.get(), from, to - from);
    if (rc == 0) {
      continue;
    }
    const int error = -rc;
    if (error == EOPNOTSUPP) {
      if (::ftruncate(device.file_fd.get(), static_cast<off_t>(to)) != 0) {  // no fallocate
        const int truncate_error = errno;
        shrink_files_locked(reserved_);
        throw OffloadError(ErrorKind::kIo, "ftruncate of swap file " + device.path +
                                               " failed: " + errno_text(truncate_error));
      }
      if (!device.no_fallocate) {
        device.no_fallocate = true;
        spdlog::warn(
            "zinf offload: the file system of swap file {} ({}) does not support fallocate: "
            "swap space cannot be reserved in advance, so if it fills up a write fails in the "
            "middle of the run (keep at least {} bytes free there)",
            device.path, describe_filesystem(device.directory, device.file_fd.get()), to);
      }
      continue;
    }
    // A partial allocation may have grown the files: give it back.
    shrink_files_locked(reserved_);
    if (error != ENOSPC) {
      throw OffloadError(ErrorKind::kIo,
                         "fallocate of swap file " + device.path + " failed: " + errno_text(error));
    }
    failure = device.path + ": reserving " + std::to_string(to - from) + " more bytes (" +
              std::to_string(to) + " in total) failed: " + errno_text(error);
    return false;
  }
  reserved_ = target;
  return true;
}

void NvmeStore::write(ExtentId id, const void* buffer) {
  std::lock_guard lock(sync_mutex_);
  sync_queue_->async_write(id, buffer);
  sync_queue_->wait();
}

void NvmeStore::read(ExtentId id, void* buffer) {
  std::lock_guard lock(sync_mutex_);
  sync_queue_->async_read(id, buffer);
  sync_queue_->wait();
}

void NvmeStore::write_range(ExtentId id, uint64_t offset, const void* buffer, uint64_t bytes) {
  const ExtentInfo info = extent(id);
  ExtentState state = ExtentState::kEmpty;
  {
    std::lock_guard lock(mutex_);
    state = checked(id, offset, bytes, "write").state;
  }
  std::lock_guard lock(sync_mutex_);
  if (offset == 0 && bytes == info.bytes) {
    sync_queue_->async_write(id, buffer);
    sync_queue_->wait();
    return;
  }
  if (state == ExtentState::kValid && !config_.checksums) {
    sync_queue_->async_transfer(id, offset, bytes, const_cast<void*>(buffer), true);
    sync_queue_->wait();
    return;
  }
  // Read-modify-write of the whole extent: keeps its checksum whole, and zero-fills a
  // never-written extent rather than leaving what a freed extent held before.
  aio::PinnedBuffer whole(info.capacity);
  if (state == ExtentState::kEmpty) {
    std::memset(whole.data(), 0, whole.capacity());
  } else {
    sync_queue_->async_read(id, whole.data());
    sync_queue_->wait();
  }
  std::memcpy(whole.data() + offset, buffer, bytes);
  sync_queue_->async_write(id, whole.data());
  sync_queue_->wait();
}

void NvmeStore::read_range(ExtentId id, uint64_t offset, void* buffer, uint64_t bytes) {
  const ExtentInfo info = extent(id);
  std::lock_guard lock(sync_mutex_);
  if (!config_.checksums || (offset == 0 && bytes == info.bytes)) {
    sync_queue_->async_transfer(id, offset, bytes, buffer, false);
    sync_queue_->wait();
    return;
  }
  aio::PinnedBuffer whole(info.capacity);
  sync_queue_->async_read(id, whole.data());
  sync_queue_->wait();
  std::memcpy(buffer, whole.data() + offset, bytes);
}

std::unique_ptr<NvmeStore::Queue> NvmeStore::make_queue() {
  return std::unique_ptr<Queue>(new Queue(*this));
}

NvmeStoreStats NvmeStore::stats() const {
  NvmeStoreStats stats;
  {
    std::lock_guard lock(mutex_);
    stats.bytes_read = bytes_read_;
    stats.bytes_written = bytes_written_;
    stats.reads = reads_;
    stats.writes = writes_;
    stats.io_requests = io_requests_;
    stats.fixed_io_requests = fixed_io_requests_;
    stats.file_bytes = end_;
    stats.reserved_bytes = reserved_;
    stats.buffered = buffered_;
    for (const Device& device : devices_) {
      stats.no_fallocate = stats.no_fallocate || device.no_fallocate;
    }
  }
  stats.replaced_stale = replaced_stale_;
  return stats;
}

}  // namespace zinf::offload
