#include "serialization/zip_reader.h"

#include <zlib.h>
#ifdef ZINF_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "serialization/serialization_error.h"
#include "serialization/zip_format.h"

namespace zinf::serialization {

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes) {
#ifdef ZINF_HAVE_LIBDEFLATE
  return ::libdeflate_crc32(crc, bytes.data(), bytes.size());
#else
  return static_cast<uint32_t>(::crc32_z(crc, bytes.data(), bytes.size()));
#endif
}

namespace {

using namespace zip_format;  // NOLINT(google-build-using-namespace): the record layouts

// Bounds-checked little-endian reads from the archive; every failure names the offset.
class Bytes {
 public:
  Bytes(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint64_t size() const { return bytes_.size(); }
  [[noreturn]] void fail(uint64_t offset, const std::string& what) const {
    throw SerializationError(name_, offset, what);
  }
  // Throws unless [offset, offset + length) lies inside the archive.
  void need(uint64_t offset, uint64_t length, const char* what) const {
    if (offset > size() || length > size() - offset) {
      fail(offset, std::string(what) + " (" + std::to_string(length) +
                       " bytes) runs past the end of the file (" + std::to_string(size()) +
                       " bytes)");
    }
  }
  template <typename T>
  T load(uint64_t offset) const {
    need(offset, sizeof(T), "field");
    T value;
    std::memcpy(&value, bytes_.data() + offset, sizeof(T));
    return value;
  }
  uint16_t u16(uint64_t offset) const { return load<uint16_t>(offset); }
  uint32_t u32(uint64_t offset) const { return load<uint32_t>(offset); }
  uint64_t u64(uint64_t offset) const { return load<uint64_t>(offset); }
  std::string_view text(uint64_t offset, uint64_t length) const {
    need(offset, length, "name");
    return {reinterpret_cast<const char*>(bytes_.data() + offset), static_cast<size_t>(length)};
  }
  std::span<const uint8_t> span(uint64_t offset, uint64_t length) const {
    need(offset, length, "record data");
    return bytes_.subspan(static_cast<size_t>(offset), static_cast<size_t>(length));
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
};

// Where the central directory lies, from the end records.
struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t end = 0;  // first byte of the end records (ZIP64 record or classic EOCD)
};

// The classic EOCD is the last signature whose comment length reaches exactly the end of the
// file; the comment is at most 65535 bytes, so the search is bounded.
uint64_t find_eocd(const Bytes& in) {
  if (in.size() < kEocdSize) {
    in.fail(0, "file of " + std::to_string(in.size()) +
                   " bytes is too small to hold a zip end-of-central-directory record");
  }
  const uint64_t lowest = in.size() > kEocdSize + 0xFFFF ? in.size() - kEocdSize - 0xFFFF : 0;
  for (uint64_t at = in.size() - kEocdSize + 1; at-- > lowest;) {
    if (in.u32(at) == kEocdSignature && at + kEocdSize + in.u16(at + 20) == in.size()) {
      return at;
    }
  }
  in.fail(kNoOffset, "no zip end-of-central-directory record (not a zip file, or truncated)");
}

Directory read_end_records(const Bytes& in) {
  const uint64_t eocd = find_eocd(in);
  if (in.u16(eocd + 4) != 0 || in.u16(eocd + 6) != 0) {
    in.fail(eocd, "multi-disk zip archives are not supported");
  }
  Directory dir;
  dir.entries = in.u16(eocd + 10);
  dir.size = in.u32(eocd + 12);
  dir.offset = in.u32(eocd + 16);
  dir.end = eocd;
  if (in.u16(eocd + 8) != dir.entries) {
    in.fail(eocd, "entries on this disk differ from the total entries");
  }
  // A ZIP64 locator right before the EOCD means the ZIP64 record holds the real values.
  if (eocd < kZip64LocatorSize || in.u32(eocd - kZip64LocatorSize) != kZip64LocatorSignature) {
    if (dir.entries == 0xFFFF || dir.size == 0xFFFFFFFF || dir.offset == 0xFFFFFFFF) {
      in.fail(eocd,
              "end-of-central-directory record needs ZIP64 values but no ZIP64 locator "
              "precedes it");
    }
    return dir;
  }
  const uint64_t locator = eocd - kZip64LocatorSize;
  if (in.u32(locator + 4) != 0 || in.u32(locator + 16) > 1) {
    in.fail(locator, "multi-disk zip archives are not supported");
  }
  const uint64_t record = in.u64(locator + 8);
  if (record > locator || locator - record < kZip64EocdSize) {
    in.fail(locator, "ZIP64 end-of-central-directory offset " + std::to_string(record) +
                         " does not leave room for the record before its locator");
  }
  if (in.u32(record) != kZip64EocdSignature) {
    in.fail(record, "bad ZIP64 end-of-central-directory signature");
  }
  const uint64_t record_size = in.u64(record + 4);  // excludes the first 12 bytes
  if (record_size < kZip64EocdSize - 12 || record_size > locator - record - 12) {
    in.fail(record, "ZIP64 end-of-central-directory record size " + std::to_string(record_size) +
                        " is inconsistent with its position");
  }
  if (in.u32(record + 16) != 0 || in.u32(record + 20) != 0) {
    in.fail(record, "multi-disk zip archives are not supported");
  }
  dir.entries = in.u64(record + 32);
  if (in.u64(record + 24) != dir.entries) {
    in.fail(record, "entries on this disk differ from the total entries");
  }
  dir.size = in.u64(record + 40);
  dir.offset = in.u64(record + 48);
  dir.end = record;
  return dir;
}

// The ZIP64 extended-information extra field: the 64-bit values replace, in this order, the
// 32-bit fields that hold 0xFFFFFFFF. `wanted` lists which are present.
struct Zip64Values {
  uint64_t size = 0;
  uint64_t compressed = 0;
  uint64_t offset = 0;
};

void read_zip64_extra(const Bytes& in, uint64_t extra, uint64_t extra_length, bool want_size,
                      bool want_compressed, bool want_offset, Zip64Values& values,
                      const std::string& entry_name) {
  if (!want_size && !want_compressed && !want_offset) {
    return;
  }
  uint64_t at = extra;
  const uint64_t end = extra + extra_length;
  while (at + 4 <= end) {
    const uint16_t id = in.u16(at);
    const uint16_t length = in.u16(at + 2);
    if (length > end - at - 4) {
      in.fail(at, "extra field of '" + entry_name + "' runs past its extra block");
    }
    if (id == kZip64ExtraId) {
      uint64_t field = at + 4;
      const uint64_t field_end = field + length;
      auto next = [&](uint64_t& out) {
        if (field_end - field < 8) {
          in.fail(at, "ZIP64 extra field of '" + entry_name + "' is too short");
        }
        out = in.u64(field);
        field += 8;
      };
      if (want_size) next(values.size);
      if (want_compressed) next(values.compressed);
      if (want_offset) next(values.offset);
      return;
    }
    at += 4 + length;
  }
  in.fail(extra, "'" + entry_name +
                     "' has 0xFFFFFFFF size or offset fields but no ZIP64 extra "
                     "field");
}

}  // namespace

ZipReader ZipReader::open(const std::string& path, Options options) {
  MappedFile file = MappedFile::open(path);
  const std::span<const uint8_t> bytes = file.bytes();
  ZipReader reader(std::move(file), bytes, path);
  reader.parse(options);
  return reader;
}

ZipReader ZipReader::from_bytes(std::span<const uint8_t> bytes, std::string name, Options options) {
  ZipReader reader(MappedFile(), bytes, std::move(name));
  reader.parse(options);
  return reader;
}

namespace {

// A central directory entry's fields that its local header must repeat.
struct CentralFields {
  uint16_t method = 0;
  uint16_t name_length = 0;
  uint64_t length = 0;  // the entry's bytes in the directory: header, name, extra, comment
};

// Central directory entry `i` at `at` (the directory ends at `dir_end`): its name, size, CRC
// and local header offset, after the checks that need only the entry.
ZipEntry read_central_entry(const Bytes& in, uint64_t at, uint64_t i, uint64_t dir_end,
                            CentralFields& fields) {
  if (dir_end - at < kCentralHeaderSize) {
    in.fail(at,
            "central directory entry " + std::to_string(i) + " runs past the central directory");
  }
  if (in.u32(at) != kCentralSignature) {
    in.fail(at, "bad central directory entry signature (entry " + std::to_string(i) + ")");
  }
  const uint16_t flags = in.u16(at + 8);
  fields.method = in.u16(at + 10);
  const uint32_t crc = in.u32(at + 16);
  const uint32_t compressed32 = in.u32(at + 20);
  const uint32_t size32 = in.u32(at + 24);
  fields.name_length = in.u16(at + 28);
  const uint16_t extra_length = in.u16(at + 30);
  const uint16_t comment_length = in.u16(at + 32);
  const uint16_t disk = in.u16(at + 34);
  const uint32_t offset32 = in.u32(at + 42);
  const uint64_t variable = uint64_t{fields.name_length} + extra_length + comment_length;
  if (variable > dir_end - at - kCentralHeaderSize) {
    in.fail(at, "central directory entry " + std::to_string(i) +
                    " (name, extra and comment) runs past the central directory");
  }
  if (fields.name_length == 0) {
    in.fail(at, "central directory entry " + std::to_string(i) + " has an empty name");
  }
  fields.length = kCentralHeaderSize + variable;
  ZipEntry entry;
  entry.name = std::string(in.text(at + kCentralHeaderSize, fields.name_length));
  if (fields.method != kMethodStored) {
    in.fail(at, "record '" + entry.name + "' is compressed (method " +
                    std::to_string(fields.method) + "); only stored records are supported");
  }
  if ((flags & kFlagEncrypted) != 0) {
    in.fail(at, "record '" + entry.name + "' is encrypted");
  }
  if (disk != 0 && disk != 0xFFFF) {
    in.fail(at, "record '" + entry.name + "' starts on another disk");
  }
  Zip64Values wide{size32, compressed32, offset32};
  read_zip64_extra(in, at + kCentralHeaderSize + fields.name_length, extra_length,
                   size32 == 0xFFFFFFFF, compressed32 == 0xFFFFFFFF, offset32 == 0xFFFFFFFF, wide,
                   entry.name);
  if (wide.size != wide.compressed) {
    in.fail(at, "stored record '" + entry.name + "' has compressed size " +
                    std::to_string(wide.compressed) + " != size " + std::to_string(wide.size));
  }
  entry.size = wide.size;
  entry.crc32 = crc;
  entry.local_header_offset = wide.offset;
  return entry;
}

// The local header of `entry` (its central entry at `at`) must agree with the central entry
// and lie, with its data, before the central directory at `dir_offset`. Sets data_offset.
void check_local_header(const Bytes& in, uint64_t at, const CentralFields& fields,
                        uint64_t dir_offset, ZipEntry& entry) {
  const uint64_t local = entry.local_header_offset;
  if (local > dir_offset || dir_offset - local < kLocalHeaderSize) {
    in.fail(at, "local header offset " + std::to_string(local) + " of '" + entry.name +
                    "' is not before the central directory");
  }
  if (in.u32(local) != kLocalSignature) {
    in.fail(local, "bad local header signature for '" + entry.name + "'");
  }
  const uint16_t local_flags = in.u16(local + 6);
  const uint16_t local_name_length = in.u16(local + 26);
  const uint16_t local_extra_length = in.u16(local + 28);
  if (in.u16(local + 8) != fields.method) {
    in.fail(local, "local header of '" + entry.name + "' disagrees on the method");
  }
  if (local_name_length != fields.name_length ||
      in.text(local + kLocalHeaderSize, local_name_length) != entry.name) {
    in.fail(local, "local header name differs from the central directory's '" + entry.name + "'");
  }
  if ((local_flags & kFlagDataDescriptor) == 0) {
    const uint32_t local_compressed32 = in.u32(local + 18);
    const uint32_t local_size32 = in.u32(local + 22);
    Zip64Values local_wide{local_size32, local_compressed32, 0};
    read_zip64_extra(in, local + kLocalHeaderSize + local_name_length, local_extra_length,
                     local_size32 == 0xFFFFFFFF, local_compressed32 == 0xFFFFFFFF, false,
                     local_wide, entry.name);
    if (in.u32(local + 14) != entry.crc32 || local_wide.size != entry.size ||
        local_wide.compressed != entry.size) {
      in.fail(local, "local header of '" + entry.name +
                         "' disagrees with the central directory on CRC or sizes");
    }
  }
  entry.data_offset = local + kLocalHeaderSize + local_name_length + local_extra_length;
  if (entry.data_offset > dir_offset || entry.size > dir_offset - entry.data_offset) {
    in.fail(entry.data_offset, "data of '" + entry.name + "' (" + std::to_string(entry.size) +
                                   " bytes) runs into the central directory or past the end");
  }
}

// No two records may share bytes.
void check_no_overlap(const Bytes& in, const std::vector<ZipEntry>& entries) {
  std::vector<const ZipEntry*> by_offset;
  by_offset.reserve(entries.size());
  for (const ZipEntry& entry : entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipEntry* a, const ZipEntry* b) {
    return a->local_header_offset < b->local_header_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipEntry& previous = *by_offset[i - 1];
    if (by_offset[i]->local_header_offset < previous.data_offset + previous.size) {
      in.fail(by_offset[i]->local_header_offset,
              "record '" + by_offset[i]->name + "' overlaps record '" + previous.name + "'");
    }
  }
}

}  // namespace

// The end records, then every central directory entry with its local header, then overlaps
// and (optionally) the CRCs.
void ZipReader::parse(const Options& options) {
  static_assert(std::endian::native == std::endian::little, "zip fields are read in place");
  const Bytes in(bytes_, name_);
  const Directory dir = read_end_records(in);
  if (dir.offset > dir.end || dir.size > dir.end - dir.offset) {
    in.fail(dir.offset, "central directory (" + std::to_string(dir.size) +
                            " bytes) does not end before the end records at offset " +
                            std::to_string(dir.end));
  }
  if (dir.entries > dir.size / kCentralHeaderSize) {
    in.fail(dir.offset, std::to_string(dir.entries) +
                            " entries cannot fit in a central "
                            "directory of " +
                            std::to_string(dir.size) + " bytes");
  }
  entries_.reserve(static_cast<size_t>(dir.entries));
  uint64_t at = dir.offset;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    CentralFields fields;
    ZipEntry entry = read_central_entry(in, at, i, dir.offset + dir.size, fields);
    check_local_header(in, at, fields, dir.offset, entry);
    if (!index_.emplace(entry.name, entries_.size()).second) {
      in.fail(at, "duplicate record name '" + entry.name + "'");
    }
    entries_.push_back(std::move(entry));
    at += fields.length;
  }
  check_no_overlap(in, entries_);
  if (options.verify_crc) {
    for (const ZipEntry& entry : entries_) {
      const uint32_t actual = crc32_update(0, data(entry));
      if (actual != entry.crc32) {
        in.fail(entry.data_offset, "CRC-32 mismatch in '" + entry.name + "'");
      }
    }
  }
}

const ZipEntry* ZipReader::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::span<const uint8_t> ZipReader::read(std::string_view name) const {
  const ZipEntry* entry = find(name);
  if (entry == nullptr) {
    throw SerializationError(name_, kNoOffset, "no record named '" + std::string(name) + "'");
  }
  return data(*entry);
}

std::span<const uint8_t> ZipReader::data(const ZipEntry& entry) const {
  return bytes_.subspan(static_cast<size_t>(entry.data_offset), static_cast<size_t>(entry.size));
}

}  // namespace zinf::serialization
