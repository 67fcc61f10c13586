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
void make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    return;
  }
  const int error = errno;
  struct stat st {};
  if (error == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return;
  }
  throw OffloadError(ErrorKind::kIo,
                     "cannot create swap directory " + path + ": " + errno_text(error));
}

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

NvmeStore::Queue::Queue(NvmeStore& store) : store_(store), io_(make_handle()) {}

std::unique_ptr<aio::AioHandle> NvmeStore::Queue::make_handle() const {
  return store_.config_.backend_factory
             ? std::make_unique<aio::AioHandle>(store_.config_.aio, store_.config_.backend_factory)
             : std::make_unique<aio::AioHandle>(store_.config_.aio);
}

aio::AioHandle& NvmeStore::Queue::handle() {
  if (!io_) {
    io_ = make_handle();
    if (!registered_.empty()) {
      (void)io_->register_buffers(registered_);  // transfers work either way
    }
  }
  return *io_;
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
                           "partial write to an extent without valid contents in " + store_.path_ +
                               " at offset " + std::to_string(extent.info.file_offset));
      }
      store_.reserve_locked(extent.info.file_offset + extent.info.capacity);
      extent.in_flight_write = true;
    } else {
      if (extent.state == ExtentState::kEmpty) {
        throw OffloadError(ErrorKind::kUsage, "read of a never-written extent in " + store_.path_ +
                                                  " at offset " +
                                                  std::to_string(extent.info.file_offset));
      }
      if (extent.state == ExtentState::kTorn) {
        throw OffloadError(ErrorKind::kCorrupt,
                           "extent in swap file " + store_.path_ + " at offset " +
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
  try {
    if (is_write) {
      handle().async_pwrite(buffer, bytes, store_.path_, pending.file_offset);
    } else {
      handle().async_pread(buffer, bytes, store_.path_, pending.file_offset);
    }
  } catch (...) {
    pending_.pop_back();
    if (is_write) {
      std::lock_guard lock(store_.mutex_);
      store_.extents_[id].in_flight_write = false;
    }
    throw;
  }
}

void NvmeStore::Queue::wait() {
  if (!io_) {
    return;  // replaced after a failure, and nothing queued since
  }
  std::optional<OffloadError> error;
  try {
    (void)io_->wait();
  } catch (const aio::IoError& e) {
    std::string message = std::string("I/O error on swap file: ") + e.what();
    if (e.error() == ENOSPC) {
      std::lock_guard lock(store_.mutex_);
      message += store_.no_fallocate_
                     ? "; the file system has no fallocate, so the swap file's space could not "
                       "be reserved in advance: free space there or choose another nvme_path"
                     : "; the file system is full";
    }
    error.emplace(ErrorKind::kIo, message);
  } catch (const std::exception& e) {
    error.emplace(ErrorKind::kIo,
                  std::string("I/O error on swap file ") + store_.path_ + ": " + e.what());
  }
  const aio::AioStats io_stats = io_->stats();
  const uint64_t requests = io_stats.requests - reported_.requests;
  const uint64_t fixed_requests = io_stats.fixed_requests - reported_.fixed_requests;
  reported_ = io_stats;
  // Whether the file went buffered is known once this handle has opened it.
  bool buffered = false;
  if (!checked_buffered_ && !pending_.empty()) {
    checked_buffered_ = true;
    buffered = !io_->buffered_paths().empty();
  }
  if (error) {
    // Whether the engine broke, a request timed out or one request failed cannot be told
    // apart reliably from here: the handle is replaced in every case (it has nothing in
    // flight now), so a broken engine never serves a later transfer.
    spdlog::warn("zinf offload: replacing the aio handle of a queue on {} after: {}", store_.path_,
                 error->what());
    io_.reset();
    reported_ = {};
    checked_buffered_ = false;
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
                      "checksum mismatch in swap file " + store_.path_ + " at offset " +
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
  const bool fixed = handle().register_buffers(ranges);
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
  if (io_) {
    io_->unregister_buffers(ranges);
  }
}

// ---- NvmeStore -------------------------------------------------------------------------

NvmeStore::NvmeStore(NvmeStoreConfig config) : config_(std::move(config)) {
  if (config_.nvme_path.empty()) {
    throw OffloadError(ErrorKind::kConfig, "nvme_path is empty: the nvme device needs a path");
  }
  if (config_.rank < 0) {
    throw OffloadError(ErrorKind::kConfig, "rank " + std::to_string(config_.rank) + " < 0");
  }
  config_.aio.validate();
  const std::string swap_root = config_.nvme_path + "/zinf_swap";
  directory_ = swap_root + "/rank" + std::to_string(config_.rank);
  path_ = directory_ + "/" + config_.name + ".swp";
  lock_path_ = directory_ + "/" + config_.name + ".lock";
  struct stat st {};
  if (::stat(config_.nvme_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw OffloadError(ErrorKind::kConfig,
                       "nvme_path " + config_.nvme_path + " is not an existing directory");
  }
  make_directory(swap_root);
  make_directory(directory_);
  try {
    take_lock_and_replace_stale();
    sync_queue_ = make_queue();
  } catch (...) {
    // No destructor runs for a throwing constructor: leave nothing on disk, except the
    // files of a live process holding the lock (not ours: lock_fd_ is empty then).
    if (lock_fd_) {
      remove_files();
    }
    throw;
  }
}

NvmeStore::~NvmeStore() {
  sync_queue_.reset();
  remove_files();
}

void NvmeStore::remove_files() noexcept {
  file_fd_.reset();
  ::unlink(path_.c_str());
  // Unlinked while still locked: a process that opened the old lock file meanwhile finds
  // it unlinked once it gets the lock, and retries (take_lock_and_replace_stale).
  ::unlink(lock_path_.c_str());
  lock_fd_.reset();
  // Removed only when empty: other stores (of this process or another) may live there.
  ::rmdir(directory_.c_str());
  ::rmdir((config_.nvme_path + "/zinf_swap").c_str());
}

void NvmeStore::take_lock_and_replace_stale() {
  for (;;) {
    aio::UniqueFd fd(::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) {
      throw OffloadError(ErrorKind::kIo,
                         "cannot open swap lock file " + lock_path_ + ": " + errno_text(errno));
    }
    int rc = 0;
    do {
      rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      throw OffloadError(ErrorKind::kIo, "swap file " + path_ +
                                             " is in use by another live process (lock " +
                                             lock_path_ + ": " + errno_text(error) +
                                             "); give each run its own nvme_path or rank");
    }
    // The lock is ours only if the file we locked is still the one at lock_path_: its
    // previous owner unlinks it at exit, possibly between our open and our flock.
    struct stat locked {};
    struct stat current {};
    if (::fstat(fd.get(), &locked) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "fstat of swap lock file " + lock_path_ + " failed: " + errno_text(errno));
    }
    if (::stat(lock_path_.c_str(), &current) == 0 && current.st_dev == locked.st_dev &&
        current.st_ino == locked.st_ino) {
      lock_fd_ = std::move(fd);
      break;
    }
  }
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    replaced_stale_ = true;
    spdlog::warn(
        "zinf offload: {} ({} bytes) is left over from a run that did not exit cleanly; "
        "replacing it",
        path_, static_cast<uint64_t>(st.st_size));
    if (::unlink(path_.c_str()) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "cannot remove stale swap file " + path_ + ": " + errno_text(errno));
    }
  }
  file_fd_ = aio::UniqueFd(::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!file_fd_) {
    throw OffloadError(ErrorKind::kIo,
                       "cannot create swap file " + path_ + ": " + errno_text(errno));
  }
}

NvmeStore::Extent& NvmeStore::checked(ExtentId id, uint64_t offset, uint64_t bytes,
                                      const char* op) {
  if (id >= extents_.size() || extents_[id].state == ExtentState::kFree) {
    throw OffloadError(ErrorKind::kUsage, std::string(op) + " of unknown extent id " +
                                              std::to_string(id) + " in " + path_);
  }
  Extent& extent = extents_[id];
  if (offset > extent.info.bytes || bytes > extent.info.bytes - offset) {
    throw OffloadError(ErrorKind::kUsage,
                       std::string(op) + " of " + std::to_string(bytes) + " bytes at " +
                           std::to_string(offset) + " exceeds the extent's " +
                           std::to_string(extent.info.bytes) + " bytes in " + path_);
  }
  if (extent.in_flight_write) {
    throw OffloadError(ErrorKind::kUsage, std::string(op) + " of extent at offset " +
                                              std::to_string(extent.info.file_offset) + " in " +
                                              path_ + " while a write to it is in flight");
  }
  return extent;
}

ExtentId NvmeStore::allocate(uint64_t bytes) {
  if (bytes == 0) {
    throw OffloadError(ErrorKind::kUsage, "extent of 0 bytes requested in " + path_);
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
    if (::ftruncate(file_fd_.get(), static_cast<off_t>(end_)) == 0) {
      reserved_ = end_;
    } else {  // the bytes stay reserved for later extents: harmless
      spdlog::warn("zinf offload: shrinking swap file {} to {} bytes failed: {}", path_, end_,
                   errno_text(errno));
    }
  }
}

ExtentInfo NvmeStore::extent(ExtentId id) const {
  std::lock_guard lock(mutex_);
  if (id >= extents_.size() || extents_[id].state == ExtentState::kFree) {
    throw OffloadError(ErrorKind::kUsage,
                       "unknown extent id " + std::to_string(id) + " in " + path_);
  }
  return extents_[id].info;
}

void NvmeStore::reserve() {
  std::lock_guard lock(mutex_);
  reserve_locked(end_);
}

void NvmeStore::reserve_locked(uint64_t needed_end) {
  if (needed_end <= reserved_ || end_ <= reserved_) {
    return;  // already reserved: nothing can take this space any more
  }
  struct statvfs fs {};
  if (::fstatvfs(file_fd_.get(), &fs) != 0) {
    throw OffloadError(ErrorKind::kIo,
                       "statvfs of swap file " + path_ + " failed: " + errno_text(errno));
  }
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  // Everything allocated at once when it fits (one fallocate, and a full disk shows up at the
  // first write); else only what this transfer needs, so one allocation that does not fit
  // does not stop the extents that do.
  const uint64_t targets[2] = {end_, needed_end};
  const size_t tries = needed_end < end_ ? 2 : 1;
  std::string failure;
  for (size_t i = 0; i < tries; ++i) {
    const uint64_t target = targets[i];
    const uint64_t needed = target - reserved_;
    if (needed > free_bytes) {
      failure = "needs " + std::to_string(needed) + " more bytes (" + std::to_string(target) +
                " in total), the file system has " + std::to_string(free_bytes) + " bytes free";
      continue;
    }
    const int rc = call_fallocate(file_fd_.get(), reserved_, needed);
    if (rc != 0) {
      const int error = -rc;
      if (error == ENOSPC) {
        // A partial allocation may have grown the file: give it back.
        if (::ftruncate(file_fd_.get(), static_cast<off_t>(reserved_)) != 0) {
          spdlog::warn("zinf offload: shrinking swap file {} to {} bytes failed: {}", path_,
                       reserved_, errno_text(errno));
        }
        failure = "reserving " + std::to_string(needed) + " more bytes (" + std::to_string(target) +
                  " in total) failed: " + errno_text(error);
        continue;
      }
      if (error != EOPNOTSUPP) {
        throw OffloadError(ErrorKind::kIo,
                           "fallocate of swap file " + path_ + " failed: " + errno_text(error));
      }
      if (::ftruncate(file_fd_.get(), static_cast<off_t>(target)) != 0) {  // no fallocate here
        throw OffloadError(ErrorKind::kIo,
                           "ftruncate of swap file " + path_ + " failed: " + errno_text(errno));
      }
      if (!no_fallocate_) {
        no_fallocate_ = true;
        spdlog::warn(
            "zinf offload: the file system of swap file {} ({}) does not support fallocate: "
            "swap space cannot be reserved in advance, so if it fills up a write fails in the "
            "middle of the run (keep at least {} bytes free there)",
            path_, describe_filesystem(directory_, file_fd_.get()), end_);
      }
    }
    reserved_ = target;
    return;
  }
  throw OffloadError(ErrorKind::kSpace,
                     "not enough free space for swap file " + path_ + ": " + failure);
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
    stats.no_fallocate = no_fallocate_;
  }
  stats.replaced_stale = replaced_stale_;
  return stats;
}

}  // namespace zinf::offload
