// AtomicFile: writes a file under a temporary name beside its final path and puts it in place
// only when complete, for the serialization writers (zip, safetensors, shard indexes).
//
// Bytes are appended through a 1 MiB buffer with pwrite (short writes continued, EINTR
// retried); skip() leaves a hole (reads back as zeros, occupies no disk where the filesystem
// supports sparse files); patch() rewrites bytes already appended (a CRC or a size known only
// after the data). commit() flushes, fsyncs, closes, renames the temporary file onto path()
// and fsyncs the directory, so after it returns the file is complete and durable; a crash at
// any earlier point leaves path() as it was. An AtomicFile destroyed without a successful
// commit() removes its temporary file.
//
// Errors throw SerializationError naming the temporary file (the directory for its fsync),
// the offset of the failed write and the errno text. After a failure every call throws.
//
// Thread safety: none; one thread uses an AtomicFile at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zinf::serialization {

class AtomicFile {
 public:
  // Creates a new file path + ".tmp.<random>" (O_EXCL, mode 0666 less the umask, as any new
  // file) in path's directory.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(std::span<const uint8_t> bytes);
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

 private:
  void check_usable() const;
  void flush();
  void pwrite_all(const uint8_t* bytes, uint64_t length, uint64_t offset);
  [[noreturn]] void fail(uint64_t offset, const std::string& what);

  const std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  bool failed_ = false;
  std::vector<uint8_t> buffer_;  // bytes for [buffer_offset_, offset_)
  uint64_t buffer_offset_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace zinf::serialization
