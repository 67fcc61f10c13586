#include "serialization/atomic_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>

#include "serialization/file_system.h"
#include "serialization/serialization_error.h"

namespace zinf::serialization {
namespace {

std::string errno_text(const std::string& op, int error) {
  return op + " failed: " + std::strerror(error);
}

// The outcome of writing a whole range: error 0 when it was all written; otherwise the errno
// (-1: no progress) at `offset`, in a call for `chunk` bytes.
struct PwriteResult {
  int error = 0;
  uint64_t offset = 0;
  size_t chunk = 0;
};

// pwrite of all `length` bytes, short writes continued (the file system retries EINTR).
// Thread-safe.
PwriteResult pwrite_all(FileSystem& fs, int fd, const uint8_t* bytes, uint64_t length,
                        uint64_t offset) {
  while (length > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(length, uint64_t{1} << 30));
    const int64_t done = fs.pwrite(fd, bytes, chunk, offset);
    if (done < 0) return {static_cast<int>(-done), offset, chunk};
    if (done == 0) return {-1, offset, chunk};
    bytes += done;
    length -= static_cast<uint64_t>(done);
    offset += static_cast<uint64_t>(done);
  }
  return {};
}

std::string describe(const PwriteResult& r) {
  const std::string op = "pwrite of " + std::to_string(r.chunk) + " bytes";
  return r.error < 0 ? op + " made no progress" : errno_text(op, r.error);
}

void warn_buffered(const std::string& path) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    spdlog::warn(
        "serialization: '{}' is on a filesystem that refuses O_DIRECT; writing through "
        "the page cache (said once)",
        path);
  }
}

}  // namespace

void AtomicFile::FreeAligned::operator()(uint8_t* p) const noexcept { std::free(p); }

AtomicFile::AtomicFile(std::string path, Mode mode)
    : path_(std::move(path)), fs_(default_file_system()) {
  for (auto& stage : stages_) {
    stage.reset(static_cast<uint8_t*>(std::aligned_alloc(kBlock, kStageBytes)));
    if (stage == nullptr) throw std::bad_alloc();
  }
  // Not mkstemp: its files are mode 0600, and the file keeps its temporary file's mode after
  // the rename. Opened with 0666 the file gets the mode the umask gives any new file.
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  int error = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%06x%04x", random() & 0xFFFFFFu,
                  static_cast<unsigned>(counter.fetch_add(1) & 0xFFFF));
    std::string candidate = path_ + suffix;
    const int fd = fs_.open(candidate, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      temp_path_ = std::move(candidate);
      break;
    }
    error = -fd;
    if (error != EEXIST) {
      throw SerializationError(candidate, kNoOffset, errno_text("open", error));
    }
  }
  if (fd_ < 0) throw SerializationError(path_ + ".tmp.*", kNoOffset, errno_text("open", error));
  if (mode == Mode::kDirect) {
    const int direct_fd = fs_.open(temp_path_, O_WRONLY | O_DIRECT | O_CLOEXEC, 0);
    if (direct_fd >= 0) {
      direct_fd_ = direct_fd;
    } else {
      const int open_error = -direct_fd;
      if (open_error != EINVAL) {
        (void)fs_.close(fd_);
        (void)fs_.unlink(temp_path_);
        throw SerializationError(temp_path_, kNoOffset,
                                 errno_text("open with O_DIRECT", open_error));
      }
      warn_buffered(temp_path_);
    }
  }
}

AtomicFile::~AtomicFile() {
  if (writing_.valid()) writing_.wait();  // its error changes nothing: the file is removed
  close_direct();
  if (fd_ >= 0) {
    (void)fs_.close(fd_);  // an error here changes nothing: the file is removed below
  }
  if (!committed_) {
    (void)fs_.unlink(temp_path_);
  }
}

void AtomicFile::close_direct() noexcept {
  if (direct_fd_ >= 0) (void)fs_.close(direct_fd_);  // nothing is buffered behind O_DIRECT
  direct_fd_ = -1;
}

void AtomicFile::fail(uint64_t offset, const std::string& what) {
  failed_ = true;
  throw SerializationError(temp_path_, offset, what);
}

void AtomicFile::check_usable() const {
  if (committed_) {
    throw SerializationError(path_, kNoOffset, "file already committed");
  }
  if (failed_) {
    throw SerializationError(temp_path_, kNoOffset, "an earlier write to this file failed");
  }
}

void AtomicFile::wait_write() {
  if (!writing_.valid()) return;
  const Written written = writing_.get();
  if (written.direct_refused) {
    warn_buffered(temp_path_);
    close_direct();
  }
  if (written.error) fail(written.error->offset, written.error->what);
}

void AtomicFile::write_blocks(const uint8_t* extra, uint64_t extra_length) {
  wait_write();
  const uint64_t staged = offset_ - buffer_offset_;
  const uint64_t whole = staged / block() * block();
  if (whole == 0 && extra_length == 0) return;
  uint8_t* const full = stages_[current_].get();
  current_ = 1 - current_;
  std::memcpy(stages_[current_].get(), full + whole, static_cast<size_t>(staged - whole));
  const uint64_t at = buffer_offset_;
  buffer_offset_ += whole + extra_length;
  offset_ += extra_length;
  const int buffered_fd = fd_;
  const int direct_fd = direct_fd_;
  FileSystem* const fs = &fs_;
  writing_ = std::async(std::launch::async, [=]() {
    Written written;
    int fd = direct_fd >= 0 ? direct_fd : buffered_fd;
    auto put = [&](const uint8_t* bytes, uint64_t length, uint64_t offset) {
      if (length == 0 || written.error) return;
      PwriteResult r = pwrite_all(*fs, fd, bytes, length, offset);
      if (r.error == EINVAL && fd == direct_fd) {
        // Opened, but the filesystem refuses the write itself: the rest goes buffered.
        written.direct_refused = true;
        fd = buffered_fd;
        const uint64_t done = r.offset - offset;
        r = pwrite_all(*fs, fd, bytes + done, length - done, r.offset);
      }
      if (r.error != 0) written.error = WriteError{r.offset, describe(r)};
    };
    put(full, whole, at);
    put(extra, extra_length, at + whole);
    return written;
  });
}

void AtomicFile::flush_all() {
  write_blocks();
  wait_write();
  const uint64_t rest = offset_ - buffer_offset_;
  if (rest == 0) return;
  const PwriteResult r = pwrite_all(fs_, fd_, stages_[current_].get(), rest, buffer_offset_);
  if (r.error != 0) fail(r.offset, describe(r));
  buffer_offset_ = offset_;
}

void AtomicFile::stage(const uint8_t* bytes, uint64_t length) {
  while (length > 0) {
    const uint64_t staged = offset_ - buffer_offset_;
    const uint64_t n = std::min(length, kStageBytes - staged);
    uint8_t* const to = stages_[current_].get() + staged;
    if (bytes != nullptr) {
      std::memcpy(to, bytes, static_cast<size_t>(n));
      bytes += n;
    } else {
      std::memset(to, 0, static_cast<size_t>(n));
    }
    offset_ += n;
    length -= n;
    if (offset_ - buffer_offset_ == kStageBytes) write_blocks();
  }
}

void AtomicFile::append(std::span<const uint8_t> bytes) {
  check_usable();
  stage(bytes.data(), bytes.size());
}

void AtomicFile::append_stable(std::span<const uint8_t> bytes) {
  check_usable();
  const uint8_t* data = bytes.data();
  uint64_t length = bytes.size();
  if (direct()) {
    const uint64_t head = std::min(length, (kBlock - offset_ % kBlock) % kBlock);
    const uint64_t whole = (length - head) / kBlock * kBlock;
    if (whole >= kInPlaceMin && reinterpret_cast<uintptr_t>(data + head) % kBlock == 0) {
      // Up to the block boundary, so nothing partial stays staged. Should O_DIRECT be
      // refused meanwhile, the run is still written in place, buffered.
      stage(data, head);
      write_blocks(data + head, whole);
      in_place_bytes_ += whole;
      data += head + whole;
      length -= head + whole;
    }
  }
  stage(data, length);
}

void AtomicFile::sync() {
  check_usable();
  wait_write();
}

void AtomicFile::skip(uint64_t count) {
  check_usable();
  // Zeros up to a block boundary, whole blocks left as a hole, zeros for the rest: the
  // staged bytes stay block-aligned in the file.
  const uint64_t b = block();
  const uint64_t pad = std::min(count, (b - offset_ % b) % b);
  stage(nullptr, pad);
  count -= pad;
  const uint64_t hole = count / b * b;
  if (hole > 0) {
    write_blocks();  // the staged bytes end on a block boundary: none stay staged
    if (offset_ != buffer_offset_) flush_all();  // O_DIRECT was refused meanwhile (block 1)
    offset_ += hole;
    buffer_offset_ = offset_;
  }
  stage(nullptr, count - hole);
}

void AtomicFile::patch(uint64_t offset, std::span<const uint8_t> bytes) {
  check_usable();
  if (offset > offset_ || bytes.size() > offset_ - offset) {
    throw SerializationError(
        temp_path_, offset,
        "patch of " + std::to_string(bytes.size()) + " bytes past the end of what was written");
  }
  wait_write();  // the bytes before buffer_offset_ are in the file once it ends
  // The part still staged is patched there, the part before it in the file (buffered: whole
  // blocks before buffer_offset_ are never written directly again).
  const uint64_t end = offset + bytes.size();
  if (end > buffer_offset_) {
    const uint64_t from = std::max(offset, buffer_offset_);
    std::memcpy(stages_[current_].get() + (from - buffer_offset_), bytes.data() + (from - offset),
                static_cast<size_t>(end - from));
  }
  if (offset < buffer_offset_) {
    const PwriteResult r =
        pwrite_all(fs_, fd_, bytes.data(), std::min(end, buffer_offset_) - offset, offset);
    if (r.error != 0) fail(r.offset, describe(r));
  }
}

void AtomicFile::commit() {
  check_usable();
  flush_all();
  // A trailing hole has no bytes written after it: the size says where the file ends.
  if (const int rc = fs_.ftruncate(fd_, offset_); rc != 0) {
    fail(offset_, errno_text("ftruncate", -rc));
  }
  // One fsync for both descriptors: they share the inode, and it flushes the device cache
  // that the direct writes may sit in.
  if (const int rc = fs_.fsync(fd_); rc != 0) fail(kNoOffset, errno_text("fsync", -rc));
  close_direct();
  const int fd = fd_;
  fd_ = -1;
  if (const int rc = fs_.close(fd); rc != 0) fail(kNoOffset, errno_text("close", -rc));
  if (const int rc = fs_.rename(temp_path_, path_); rc != 0) {
    fail(kNoOffset, errno_text("rename to " + path_, -rc));
  }
  committed_ = true;
  // The rename is durable once the directory is synced.
  std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (parent.empty()) parent = ".";
  if (const int rc = sync_directory(fs_, parent.string()); rc != 0) {
    throw SerializationError(parent.string(), kNoOffset, errno_text("directory fsync", -rc));
  }
}

}  // namespace zinf::serialization
