// AtomicFile: writes a file under a temporary name beside its final path and puts it in place
// only when complete, for the serialization writers (zip, safetensors, shard indexes).
//
// Bytes are appended through a staging buffer; full buffers are written by a background
// thread while the caller fills the other one (two 16 MiB buffers, at most one write in
// flight). Where the filesystem accepts O_DIRECT the staged bytes are written with it, in
// whole 4 KiB blocks from 4 KiB-aligned memory and offsets: a checkpoint streams gigabytes
// that would otherwise be copied through the page cache and written back at fsync. Bytes
// that do not fill a block (the file's tail, patches of bytes already written) go through an
// ordinary buffered descriptor of the same file, to pages no direct write touches again. A
// filesystem that refuses O_DIRECT (tmpfs) gets buffered writes, with one warning per
// process. Either way the file's bytes are the same.
//
// append_stable() takes bytes the caller keeps unchanged until sync() or commit(): whole blocks of
// them that lie at the file offset's alignment in memory (a record aligned to 4 KiB in the
// file, from page-aligned memory) are written with O_DIRECT straight from the caller's
// memory, with no copy; the rest is staged as append() does.
//
// skip() leaves a hole (reads back as zeros; whole blocks of it occupy no disk where the
// filesystem supports sparse files); patch() rewrites bytes already appended (a CRC or a size
// known only after the data). commit() writes what is staged, sets the size, fsyncs once,
// closes, renames the temporary file onto path() and fsyncs the directory, so after it
// returns the file is complete and durable; a crash at any earlier point leaves path() as it
// was. An AtomicFile destroyed without a successful commit() removes its temporary file.
//
// Every system call goes through the FileSystem that default_file_system() returned at
// construction (file_system.h), so tests can simulate a power loss under it.
//
// Errors throw SerializationError naming the temporary file (the directory for its fsync),
// the offset of the failed write and the errno text. After a failure every call throws; an
// error of a background write is thrown by the next call that waits for it.
//
// Thread safety: none; one thread uses an AtomicFile at a time (the background write is
// internal).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace zinf::serialization {

class FileSystem;

class AtomicFile {
 public:
  enum class Mode {
    kDirect,    // O_DIRECT for whole blocks where the filesystem allows it (the default)
    kBuffered,  // every byte through the page cache
  };

  // Creates a new file path + ".tmp.<random>" (O_EXCL, mode 0666 less the umask, as any new
  // file) in path's directory.
  explicit AtomicFile(std::string path, Mode mode = Mode::kDirect);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(std::span<const uint8_t> bytes);
  // As append(), for bytes that stay valid and unchanged until sync() or commit() returns or
  // this AtomicFile is destroyed (see the header comment).
  void append_stable(std::span<const uint8_t> bytes);
  // Waits for the background write, if any (throws its error): after it returns, no write
  // reads the memory of an earlier append_stable() any more.
  void sync();
  // Advances the end by `count` bytes without writing them (a hole of zeros).
  void skip(uint64_t count);
  // Overwrites bytes at [offset, offset + bytes.size()), which must all have been appended.
  void patch(uint64_t offset, std::span<const uint8_t> bytes);
  // Makes the file complete, durable and visible under path().
  void commit();

  // The number of bytes appended or skipped so far: where the next byte lands.
  uint64_t offset() const noexcept { return offset_; }
  const std::string& path() const noexcept { return path_; }
  const std::string& temp_path() const noexcept { return temp_path_; }
  bool committed() const noexcept { return committed_; }
  // Whether whole blocks are still written with O_DIRECT (false in kBuffered mode, and once
  // the filesystem refused it).
  bool direct() const noexcept { return direct_fd_ >= 0; }
  // Bytes append_stable() handed to the writer in place, without a copy.
  uint64_t in_place_bytes() const noexcept { return in_place_bytes_; }

 private:
  struct WriteError {
    uint64_t offset;
    std::string what;
  };
  struct Written {
    std::optional<WriteError> error;
    bool direct_refused = false;  // the O_DIRECT write failed with EINVAL; done buffered
  };
  struct FreeAligned {
    void operator()(uint8_t* p) const noexcept;
  };

  void check_usable() const;
  uint64_t block() const noexcept { return direct() ? kBlock : 1; }
  // Waits for the background write, if any, and throws its error.
  void wait_write();
  // Hands the staged whole blocks to the background writer, then `extra_length` bytes of the
  // caller's memory at `extra` (whole blocks, block-aligned, right after them in the file;
  // only when nothing stays staged); keeps the partial block staged.
  void write_blocks(const uint8_t* extra = nullptr, uint64_t extra_length = 0);
  // Writes everything staged, now, through the buffered descriptor for the partial block.
  void flush_all();
  void stage(const uint8_t* bytes, uint64_t length);  // nullptr: zeros
  void close_direct() noexcept;
  [[noreturn]] void fail(uint64_t offset, const std::string& what);

  static constexpr uint64_t kBlock = 4096;
  static constexpr uint64_t kStageBytes = uint64_t{16} << 20;
  static constexpr uint64_t kInPlaceMin = uint64_t{1} << 20;  // smaller runs are copied

  const std::string path_;
  FileSystem& fs_;  // default_file_system() at construction
  std::string temp_path_;
  int fd_ = -1;         // buffered
  int direct_fd_ = -1;  // O_DIRECT; -1 when not used
  bool committed_ = false;
  bool failed_ = false;
  std::unique_ptr<uint8_t, FreeAligned> stages_[2];
  int current_ = 0;             // stages_[current_] holds bytes for [buffer_offset_, offset_)
  uint64_t buffer_offset_ = 0;  // a multiple of block()
  uint64_t offset_ = 0;
  uint64_t in_place_bytes_ = 0;
  std::future<Written> writing_;  // the other stage, being written; declared last: ends first
};

}  // namespace zinf::serialization
