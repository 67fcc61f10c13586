// ZipWriter: writes a zip archive the way torch.save does — records stored uncompressed, one
// after another, each record's data starting on a 64-byte boundary (the padding lives in the
// local header's extra field, id "FB", as torch writes it) — so that readers can map the
// file and use record data in place. ZIP64 extra fields are written for records whose size
// or offset does not fit 32 bits, and the ZIP64 end records when the archive needs them
// (Options::force_zip64 writes them always; tests use it to exercise the ZIP64 paths of
// readers without writing 4 GiB).
//
// Streaming: begin_record(name, size) then write(chunk)... until `size` bytes were given, or
// add_record(name, bytes). The CRC-32 is computed while writing and patched into the local
// header afterwards, so no data descriptor is needed and nothing is held in memory beyond a
// 1 MiB write buffer. A caller that already has each chunk's CRC-32 (worker threads that
// produced the chunk, say) passes it with write(chunk, chunk_crc): the writer then only
// combines CRCs (zlib's crc32_combine, O(log size)) and the writing thread only writes.
//
// Crash safety: everything goes to a temporary file beside `path` (path + ".tmp.<random>");
// finish() writes the central directory, fsyncs the file, renames it over `path` and fsyncs
// the directory. A writer destroyed without a successful finish() removes its temporary file,
// so `path` is either untouched or the complete archive.
//
// Errors: SerializationError naming the temporary file (or `path` for the rename), the offset
// and the errno text; misuse (a record longer or shorter than declared, a duplicate name,
// write() with no record open) throws SerializationError too. After an error the writer
// accepts no more calls and removes its temporary file when destroyed.
//
// Why not libzip: libzip 1.7 cannot place record data at aligned offsets (it chooses the
// extra fields itself), and it writes an archive at zip_close() from sources it reads then,
// not as a stream of chunks.
//
// Thread safety: none; one thread uses a writer at a time.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serialization/atomic_file.h"

namespace zinf::serialization {

class ZipWriter {
 public:
  struct Options {
    bool force_zip64 = false;  // ZIP64 extra fields on every record and ZIP64 end records
    uint64_t alignment = 64;   // record data offsets are multiples of this: a power of two,
                               // at most 4096
  };

  // Creates the temporary file beside `path`. Throws SerializationError.
  ZipWriter(std::string path, Options options);
  explicit ZipWriter(std::string path) : ZipWriter(std::move(path), Options{}) {}
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // Starts a record of exactly `size_bytes` bytes. The previous record must be complete.
  // `alignment` (a power of two, at most 4096; 0: Options::alignment) places its data.
  void begin_record(std::string_view name, uint64_t size_bytes, uint64_t alignment = 0);
  // Appends to the open record.
  void write(std::span<const uint8_t> chunk);
  // Appends to the open record, taking `chunk_crc` (crc32_update(0, chunk), see zip_reader.h)
  // as the chunk's CRC-32 instead of computing it. The caller must give the right value: the
  // writer does not check it, and a wrong one makes readers that verify CRCs refuse the record.
  void write(std::span<const uint8_t> chunk, uint32_t chunk_crc);
  // write(chunk, chunk_crc) for bytes that stay valid and unchanged until sync() or finish()
  // returns or the writer is destroyed: large runs are written from them in place
  // (AtomicFile::append_stable), e.g. a 4096-aligned record from page-aligned memory.
  void write_stable(std::span<const uint8_t> chunk, uint32_t chunk_crc);
  // After it returns, no write reads the memory given to write_stable() any more.
  void sync() { file_.sync(); }
  // Appends `count` zero bytes to the open record; large runs become a hole in the file.
  void write_zeros(uint64_t count);
  // begin_record(name, bytes.size()) + write(bytes).
  void add_record(std::string_view name, std::span<const uint8_t> bytes);
  // Writes the central directory and end records, fsyncs, renames onto path(). After it
  // returns, the archive is complete and durable.
  void finish();

  const std::string& path() const noexcept { return file_.path(); }
  const std::string& temp_path() const noexcept { return file_.temp_path(); }
  // Bytes of archive produced so far (the offset the next byte lands at).
  uint64_t offset() const noexcept { return file_.offset(); }

 private:
  struct Record {
    std::string name;
    uint64_t header_offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
  };

  void check_usable() const;
  // Checks that `count` more bytes fit in the open record; returns the record.
  Record& open_record_for(uint64_t count, const char* call);
  void write_with_crc(std::span<const uint8_t> chunk, uint32_t chunk_crc, bool stable);
  // Fails unless `alignment` is a power of two of at most 4096; `what` names it.
  void check_alignment(const char* what, uint64_t alignment);
  void close_record();
  [[noreturn]] void fail(const std::string& what);

  const Options options_;
  AtomicFile file_;
  bool failed_ = false;  // misuse was reported; the archive cannot be completed
  std::vector<Record> records_;
  std::set<std::string, std::less<>> names_;
  bool record_open_ = false;
  uint64_t record_written_ = 0;  // bytes of the open record written so far
};

}  // namespace zinf::serialization
