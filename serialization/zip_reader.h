// ZipReader: reads the ZIP64 archives torch.save writes (and any other stored-only zip) from a
// read-only memory mapping, without loading the file.
//
// Only the end-of-central-directory records (classic and ZIP64) and the central directory are
// parsed at open; each record's local header is checked against its central entry, and a
// record's data is handed out as a zero-copy std::span into the mapping. Only stored
// (uncompressed, unencrypted) records are accepted: torch writes nothing else, and a
// compressed record is an error naming it. Single-disk archives only.
//
// Everything is validated before use: offsets and sizes inside the file, central directory
// inside the file and before the end records, entry counts bounded by what the central
// directory's size can hold (so nothing is allocated that the file size cannot justify),
// local headers consistent with the central ones (name, method, and sizes and CRC unless the
// record uses a data descriptor), records not overlapping each other or the central
// directory, names non-empty and unique. CRC-32 of every record is checked at open when
// Options::verify_crc is set (it reads every byte). Any violation throws SerializationError
// naming the file, the offset and what was wrong.
//
// Why not libzip (Debian's libzip 1.7 reads ZIP64 fine): it reads entries through zip_fread
// into caller buffers, so it cannot hand out spans into a mapping (a checkpoint of hundreds
// of GB would be copied), and it has no way to tell where a stored record's data lies in the
// file. The tests use libzip as an independent checker of what ZipWriter writes.
//
// Thread safety: a ZipReader is immutable after open; all const methods may be called from
// any number of threads. Spans stay valid while the reader (or, for from_bytes, the caller's
// buffer) lives.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serialization/mapped_file.h"

namespace zinf::serialization {

// CRC-32 (the zip/zlib polynomial) of `bytes`, continuing from `crc` (0 to start): zlib's
// crc32 values, computed by libdeflate where the build found it (serialization's
// CMakeLists.txt). Thread-safe.
[[nodiscard]] uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes);

// One stored record of an archive, as located from its central-directory entry.
struct ZipEntry {
  std::string name;
  uint64_t local_header_offset = 0;  // bytes from the start of the file
  uint64_t data_offset = 0;          // first byte of the record's data
  uint64_t size = 0;                 // bytes of data (stored: compressed == uncompressed)
  uint32_t crc32 = 0;                // as recorded in the central directory
};

class ZipReader {
 public:
  struct Options {
    bool verify_crc = false;  // check every record's CRC-32 at open (reads all data)
  };

  // Maps `path` and parses its central directory. Throws SerializationError.
  [[nodiscard]] static ZipReader open(const std::string& path, Options options);
  [[nodiscard]] static ZipReader open(const std::string& path) { return open(path, Options{}); }
  // Parses an archive held in caller memory; `name` is used in errors. The caller keeps
  // `bytes` alive and unchanged while the reader or any span from it is used.
  [[nodiscard]] static ZipReader from_bytes(std::span<const uint8_t> bytes, std::string name,
                                            Options options);

  ZipReader(ZipReader&&) noexcept = default;
  ZipReader& operator=(ZipReader&&) noexcept = default;
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  // The records in central-directory order.
  const std::vector<ZipEntry>& entries() const noexcept { return entries_; }
  // The record named `name`, or nullptr.
  const ZipEntry* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // The data of the record named `name`; throws SerializationError when there is none.
  std::span<const uint8_t> read(std::string_view name) const;
  // The data of `entry` (an element of entries()).
  std::span<const uint8_t> data(const ZipEntry& entry) const;
  // The file's name as used in errors (the path for open()).
  const std::string& name() const noexcept { return name_; }

 private:
  ZipReader(MappedFile file, std::span<const uint8_t> bytes, std::string name)
      : file_(std::move(file)), bytes_(bytes), name_(std::move(name)) {}
  void parse(const Options& options);

  MappedFile file_;  // empty for from_bytes
  std::span<const uint8_t> bytes_;
  std::string name_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_
};

}  // namespace zinf::serialization
