// TorchArchive / TorchArchiveWriter: the torch.save zip format on top of ZipReader/ZipWriter
// and the pickle reader/writer.
//
// Layout (what torch 1.13 writes; all records under one top folder, `archive/` by default):
// `<top>/data.pkl` (pickle protocol 2; tensors are persistent ids naming storage keys),
// `<top>/data/<key>` (the raw little-endian bytes of each storage), `<top>/version` ("3\n").
// Newer torch versions add `byteorder`, `.format_version`, `.storage_alignment` and
// `.data/serialization_id`; the reader ignores them and the writer, like torch 1.13, writes
// none of them (torch.load of 1.13 and later reads the archive without them).
//
// Reading maps the file; record bytes are spans into the mapping, valid while the archive
// lives. Nothing in the pickle is executed (see pickle_reader.h).
//
// Errors: SerializationError naming the archive (and the record) for a missing data.pkl, a
// storage record that is missing or shorter than its numel says, a tensor asked for as one
// span that is not contiguous, and everything the zip and pickle layers refuse. The writer
// refuses at finish() an archive whose pickle names a storage that was not written with the
// size its numel implies.
//
// Thread safety: a TorchArchive is immutable after open() and may be read from any thread;
// a TorchArchiveWriter is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "serialization/pickle_value.h"
#include "serialization/zip_reader.h"
#include "serialization/zip_writer.h"

namespace zinf::serialization {

class TorchArchive {
 public:
  // Maps `path`, finds the one `*/data.pkl` record and decodes it.
  [[nodiscard]] static TorchArchive open(const std::string& path);

  TorchArchive(TorchArchive&&) noexcept = default;
  TorchArchive& operator=(TorchArchive&&) noexcept = default;
  TorchArchive(const TorchArchive&) = delete;
  TorchArchive& operator=(const TorchArchive&) = delete;

  // The decoded data.pkl.
  [[nodiscard]] const PickleValue& root() const { return document_.root(); }
  [[nodiscard]] const PickleDocument& document() const noexcept { return document_; }
  // The top folder with its slash ("archive/").
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  // The whole storage record `data/<key>`, checked to hold numel elements of its dtype.
  [[nodiscard]] std::span<const uint8_t> storage_bytes(const StorageRef& storage) const;
  // The storage's whole record (at least its elements; checked as storage_bytes() does), with
  // what the archive records for it, for readers that check the CRC-32 as they copy the data.
  struct StorageRecord {
    std::span<const uint8_t> bytes;
    uint32_t crc32 = 0;        // from the central directory
    uint64_t data_offset = 0;  // of the first byte, in the file
    std::string name;          // "<top>/data/<key>"
  };
  [[nodiscard]] StorageRecord storage_record(const StorageRef& storage) const;
  // The bytes of a contiguous tensor (its elements from storage_offset on); a tensor that is
  // not contiguous is an error (read storage_bytes() and apply the strides instead).
  [[nodiscard]] std::span<const uint8_t> tensor_bytes(const TensorRef& tensor) const;

 private:
  TorchArchive(ZipReader zip, std::string prefix, PickleDocument document)
      : zip_(std::move(zip)), prefix_(std::move(prefix)), document_(std::move(document)) {}

  ZipReader zip_;
  std::string prefix_;
  PickleDocument document_;
};

class TorchArchiveWriter {
 public:
  // Starts the archive (a temporary file until finish(); see zip_writer.h). `top` is the
  // records' top folder.
  explicit TorchArchiveWriter(std::string path, std::string top = "archive");
  TorchArchiveWriter(const TorchArchiveWriter&) = delete;
  TorchArchiveWriter& operator=(const TorchArchiveWriter&) = delete;

  // Writes data.pkl from `root` and records which storages it names and their byte sizes.
  // Call once, before or after the storages.
  void write_pickle(const PickleValue& root);
  // Writes storage `key` whole, or streams it: begin_storage(key, size) then write() chunks.
  void add_storage(std::string_view key, std::span<const uint8_t> bytes);
  // `alignment`: of the storage's data in the file (0: torch's 64; see ZipWriter).
  void begin_storage(std::string_view key, uint64_t size_bytes, uint64_t alignment = 0);
  void write(std::span<const uint8_t> chunk);
  // write() with the chunk's CRC-32 computed by the caller (see ZipWriter::write).
  void write(std::span<const uint8_t> chunk, uint32_t chunk_crc);
  // write(chunk, chunk_crc) for bytes kept unchanged until sync() or finish()
  // (ZipWriter::write_stable, ZipWriter::sync).
  void write_stable(std::span<const uint8_t> chunk, uint32_t chunk_crc);
  void sync() { zip_.sync(); }
  // Writes `version`, checks that every storage the pickle names was written with
  // numel * element size bytes, and renames the archive into place.
  void finish();

 private:
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  std::string top_;
  ZipWriter zip_;
  bool pickle_written_ = false;
  std::map<std::string, uint64_t> needed_bytes_;   // storage key -> bytes the pickle implies
  std::map<std::string, uint64_t> written_bytes_;  // storage key -> bytes declared
};

}  // namespace zinf::serialization
