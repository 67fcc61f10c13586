#include "offload/nvme_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "aio/pinned_buffer.h"
#include "offload/error.h"
#include "offload/footprint.h"
#include "offload/mount_info.h"

namespace zinf::offload {
namespace {

std::string errno_text(int error) { return std::string(std::strerror(error)); }

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

}  // namespace

void set_fallocate_function_for_testing(FallocateFunction function) {
  g_fallocate_function.store(function, std::memory_order_release);
}

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
  if (config_.stripe_bytes == 0 || config_.stripe_bytes % kSwapExtentAlignment != 0) {
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
    name_swap_folder(device, config_.rank, config_.name);
    label_ += (i == 0 ? "" : ", ") + device.path;
  }
  try {
    for (Device& device : devices_) {
      if (take_swap_folder(device)) {
        replaced_stale_ = true;
      }
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
    remove_swap_folder(device);
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
  const uint64_t capacity = swap_extent(bytes);
  std::lock_guard lock(mutex_);
  const uint64_t offset = spans_.take(capacity);
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
  if (!spans_.give_back(extent.info.file_offset, extent.info.capacity)) {
    return;
  }
  // The free span was the tail: the allocated span ends before it, so later space checks no
  // longer count it, and its reserved bytes go back to the file system.
  if (reserved_ > spans_.end()) {
    shrink_files_locked(spans_.end());
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
  reserve_locked(spans_.end());
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
  const uint64_t end = spans_.end();
  if (needed_end <= reserved_ || end <= reserved_) {
    return;  // already reserved: nothing can take this space any more
  }
  // Everything allocated at once when it fits (one fallocate per file, and a full disk shows
  // up at the first write); else only what this transfer needs, so one allocation that does
  // not fit does not stop the extents that do.
  std::string failure;
  if (try_reserve_locked(end, failure)) {
    return;
  }
  if (needed_end < end && try_reserve_locked(needed_end, failure)) {
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
    stats.file_bytes = spans_.end();
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