#include "serialization/zip_writer.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "serialization/serialization_error.h"
#include "serialization/zip_format.h"
#include "serialization/zip_reader.h"

namespace zinf::serialization {
namespace {

using namespace zip_format;  // NOLINT(google-build-using-namespace): the record layouts

constexpr uint64_t kHoleMinBytes = uint64_t{1} << 16;  // shorter zero runs are written

// Little-endian field appenders for headers assembled in memory.
void put16(std::vector<uint8_t>& out, uint16_t value) {
  out.push_back(static_cast<uint8_t>(value));
  out.push_back(static_cast<uint8_t>(value >> 8));
}
void put32(std::vector<uint8_t>& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}
void put64(std::vector<uint8_t>& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}
uint32_t clamp32(uint64_t value) { return value >= kMax32 ? kMax32 : static_cast<uint32_t>(value); }

// CRC-32 of `count` zero bytes, from the CRCs of power-of-two runs combined with zlib.
uint32_t crc32_of_zeros(uint64_t count) {
  static const std::array<uint32_t, 64> kPowers = [] {
    std::array<uint32_t, 64> powers{};
    const uint8_t zero = 0;
    powers[0] = static_cast<uint32_t>(::crc32_z(0, &zero, 1));
    for (size_t k = 1; k < powers.size(); ++k) {
      powers[k] = static_cast<uint32_t>(::crc32_combine(
          powers[k - 1], powers[k - 1], static_cast<z_off_t>(uint64_t{1} << (k - 1))));
    }
    return powers;
  }();
  uint32_t crc = 0;
  for (size_t k = 0; k < 63; ++k) {
    if ((count >> k) & 1) {
      crc = static_cast<uint32_t>(
          ::crc32_combine(crc, kPowers[k], static_cast<z_off_t>(uint64_t{1} << k)));
    }
  }
  return crc;
}

}  // namespace

ZipWriter::ZipWriter(std::string path, Options options)
    : options_(options), file_(std::move(path)) {
  check_alignment("zip", options_.alignment);
}

void ZipWriter::check_alignment(const char* what, uint64_t alignment) {
  if (!std::has_single_bit(alignment) || alignment > 4096) {
    fail(std::string(what) + " alignment " + std::to_string(alignment) +
         " is not a power of two of at most 4096");
  }
}

void ZipWriter::fail(const std::string& what) {
  failed_ = true;
  throw SerializationError(file_.temp_path(), file_.offset(), what);
}

void ZipWriter::check_usable() const {
  if (file_.committed()) {
    throw SerializationError(file_.path(), kNoOffset, "zip writer already finished");
  }
  if (failed_) {
    throw SerializationError(file_.temp_path(), kNoOffset, "zip writer failed earlier");
  }
}

void ZipWriter::begin_record(std::string_view name, uint64_t size_bytes, uint64_t alignment) {
  check_usable();
  close_record();
  if (alignment == 0) alignment = options_.alignment;
  check_alignment("record", alignment);
  if (name.empty() || name.size() > kMax16) {
    fail("record name length " + std::to_string(name.size()) + " is not in 1..65535");
  }
  if (names_.contains(name)) {
    fail("duplicate record name '" + std::string(name) + "'");
  }
  const bool zip64 = options_.force_zip64 || size_bytes >= kMax32;
  std::vector<uint8_t> header;
  header.reserve(kLocalHeaderSize + name.size() + 24 + options_.alignment);
  put32(header, kLocalSignature);
  put16(header, zip64 ? kVersionZip64 : kVersionStored);
  put16(header, kFlagUtf8);
  put16(header, kMethodStored);
  put16(header, 0);       // time 00:00
  put16(header, 0x0021);  // date 1980-01-01: deterministic output
  put32(header, 0);       // CRC-32, patched by close_record()
  put32(header, zip64 ? kMax32 : static_cast<uint32_t>(size_bytes));
  put32(header, zip64 ? kMax32 : static_cast<uint32_t>(size_bytes));
  put16(header, static_cast<uint16_t>(name.size()));
  const size_t extra_length_at = header.size();
  put16(header, 0);  // extra length, set below
  header.insert(header.end(), name.begin(), name.end());
  const size_t extra_start = header.size();
  if (zip64) {
    put16(header, kZip64ExtraId);
    put16(header, 16);
    put64(header, size_bytes);
    put64(header, size_bytes);
  }
  // The padding field's own 4-byte header is always written, as torch does.
  const uint64_t unpadded = file_.offset() + header.size() + 4;
  const uint64_t padding = (alignment - unpadded % alignment) % alignment;
  put16(header, kPaddingExtraId);
  put16(header, static_cast<uint16_t>(padding));
  header.insert(header.end(), static_cast<size_t>(padding), 'Z');
  const auto extra_length = static_cast<uint16_t>(header.size() - extra_start);
  header[extra_length_at] = static_cast<uint8_t>(extra_length);
  header[extra_length_at + 1] = static_cast<uint8_t>(extra_length >> 8);

  records_.push_back(Record{std::string(name), file_.offset(), size_bytes, 0});
  names_.emplace(name);
  file_.append(header);
  record_open_ = true;
  record_written_ = 0;
}

ZipWriter::Record& ZipWriter::open_record_for(uint64_t count, const char* call) {
  check_usable();
  if (!record_open_) {
    fail(std::string(call) + " with no record open");
  }
  Record& record = records_.back();
  if (count > record.size - record_written_) {
    fail("record '" + record.name + "' declared " + std::to_string(record.size) +
         " bytes; writing " + std::to_string(count) + " more after " +
         std::to_string(record_written_));
  }
  return record;
}

void ZipWriter::write(std::span<const uint8_t> chunk) {
  Record& record = open_record_for(chunk.size(), "write()");
  record.crc = crc32_update(record.crc, chunk);
  file_.append(chunk);
  record_written_ += chunk.size();
}

void ZipWriter::write(std::span<const uint8_t> chunk, uint32_t chunk_crc) {
  write_with_crc(chunk, chunk_crc, false);
}

void ZipWriter::write_stable(std::span<const uint8_t> chunk, uint32_t chunk_crc) {
  write_with_crc(chunk, chunk_crc, true);
}

void ZipWriter::write_with_crc(std::span<const uint8_t> chunk, uint32_t chunk_crc, bool stable) {
  Record& record = open_record_for(chunk.size(), stable ? "write_stable()" : "write()");
  record.crc = static_cast<uint32_t>(
      ::crc32_combine(record.crc, chunk_crc, static_cast<z_off_t>(chunk.size())));
  if (stable) {
    file_.append_stable(chunk);
  } else {
    file_.append(chunk);
  }
  record_written_ += chunk.size();
}

void ZipWriter::write_zeros(uint64_t count) {
  Record& record = open_record_for(count, "write_zeros()");
  if (count < kHoleMinBytes) {
    static const std::array<uint8_t, kHoleMinBytes> kZeros{};
    write(std::span<const uint8_t>(kZeros.data(), static_cast<size_t>(count)));
    return;
  }
  record.crc = static_cast<uint32_t>(
      ::crc32_combine(record.crc, crc32_of_zeros(count), static_cast<z_off_t>(count)));
  file_.skip(count);  // a hole: later writes extend the file past it
  record_written_ += count;
}

void ZipWriter::add_record(std::string_view name, std::span<const uint8_t> bytes) {
  begin_record(name, bytes.size());
  write(bytes);
}

void ZipWriter::close_record() {
  if (!record_open_) return;
  const Record& record = records_.back();
  if (record_written_ != record.size) {
    fail("record '" + record.name + "' declared " + std::to_string(record.size) + " bytes but " +
         std::to_string(record_written_) + " were written");
  }
  record_open_ = false;
  uint8_t crc[4];
  for (int i = 0; i < 4; ++i) crc[i] = static_cast<uint8_t>(record.crc >> (8 * i));
  file_.patch(record.header_offset + 14, crc);
}

void ZipWriter::finish() {
  check_usable();
  close_record();
  const uint64_t directory_offset = file_.offset();
  std::vector<uint8_t> out;
  for (const Record& record : records_) {
    out.clear();
    const bool wide_size = options_.force_zip64 || record.size >= kMax32;
    const bool wide_offset = options_.force_zip64 || record.header_offset >= kMax32;
    const uint16_t version = wide_size || wide_offset ? kVersionZip64 : kVersionStored;
    put32(out, kCentralSignature);
    put16(out, version);  // made by: MS-DOS host, so no Unix attributes are implied
    put16(out, version);
    put16(out, kFlagUtf8);
    put16(out, kMethodStored);
    put16(out, 0);
    put16(out, 0x0021);
    put32(out, record.crc);
    put32(out, wide_size ? kMax32 : static_cast<uint32_t>(record.size));
    put32(out, wide_size ? kMax32 : static_cast<uint32_t>(record.size));
    put16(out, static_cast<uint16_t>(record.name.size()));
    const uint16_t extra = static_cast<uint16_t>((wide_size || wide_offset ? 4 : 0) +
                                                 (wide_size ? 16 : 0) + (wide_offset ? 8 : 0));
    put16(out, extra);
    put16(out, 0);  // comment
    put16(out, 0);  // disk
    put16(out, 0);  // internal attributes
    put32(out, 0);  // external attributes
    put32(out, wide_offset ? kMax32 : static_cast<uint32_t>(record.header_offset));
    out.insert(out.end(), record.name.begin(), record.name.end());
    if (extra != 0) {
      put16(out, kZip64ExtraId);
      put16(out, static_cast<uint16_t>(extra - 4));
      if (wide_size) {
        put64(out, record.size);
        put64(out, record.size);
      }
      if (wide_offset) put64(out, record.header_offset);
    }
    file_.append(out);
  }
  const uint64_t directory_size = file_.offset() - directory_offset;
  const uint64_t count = records_.size();
  const bool zip64 = options_.force_zip64 || count >= kMax16 || directory_offset >= kMax32 ||
                     directory_size >= kMax32;
  out.clear();
  if (zip64) {
    const uint64_t record_offset = file_.offset();
    put32(out, kZip64EocdSignature);
    put64(out, kZip64EocdSize - 12);
    put16(out, kVersionZip64);
    put16(out, kVersionZip64);
    put32(out, 0);  // this disk
    put32(out, 0);  // directory's disk
    put64(out, count);
    put64(out, count);
    put64(out, directory_size);
    put64(out, directory_offset);
    put32(out, kZip64LocatorSignature);
    put32(out, 0);
    put64(out, record_offset);
    put32(out, 1);  // total disks
  }
  const uint16_t count16 = zip64 ? kMax16 : static_cast<uint16_t>(count);
  put32(out, kEocdSignature);
  put16(out, 0);
  put16(out, 0);
  put16(out, count16);
  put16(out, count16);
  put32(out, zip64 ? kMax32 : clamp32(directory_size));
  put32(out, zip64 ? kMax32 : clamp32(directory_offset));
  put16(out, 0);  // comment
  file_.append(out);
  file_.commit();
}

}  // namespace zinf::serialization
