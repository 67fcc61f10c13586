// Record layouts of the zip format (APPNOTE.TXT 6.3) shared by ZipReader and ZipWriter:
// signatures, fixed header sizes, flags and extra-field ids. All fields are little-endian.
// Internal to serialization.
#pragma once

#include <cstdint>

namespace zinf::serialization::zip_format {

inline constexpr uint32_t kLocalSignature = 0x04034b50;
inline constexpr uint32_t kCentralSignature = 0x02014b50;
inline constexpr uint32_t kEocdSignature = 0x06054b50;
inline constexpr uint32_t kZip64EocdSignature = 0x06064b50;
inline constexpr uint32_t kZip64LocatorSignature = 0x07064b50;

inline constexpr uint64_t kLocalHeaderSize = 30;    // before the name and extra field
inline constexpr uint64_t kCentralHeaderSize = 46;  // before name, extra and comment
inline constexpr uint64_t kEocdSize = 22;           // before the comment
inline constexpr uint64_t kZip64EocdSize = 56;      // without extensible data
inline constexpr uint64_t kZip64LocatorSize = 20;

inline constexpr uint16_t kMethodStored = 0;
inline constexpr uint16_t kFlagEncrypted = 1u << 0;
inline constexpr uint16_t kFlagDataDescriptor = 1u << 3;
inline constexpr uint16_t kFlagUtf8 = 1u << 11;

inline constexpr uint16_t kZip64ExtraId = 0x0001;
// torch pads local headers with an extra field whose id is the bytes "FB", filled with 'Z'.
inline constexpr uint16_t kPaddingExtraId = 0x4246;

inline constexpr uint16_t kVersionZip64 = 45;  // 4.5: ZIP64
inline constexpr uint16_t kVersionStored = 20;

inline constexpr uint32_t kMax32 = 0xFFFFFFFF;
inline constexpr uint16_t kMax16 = 0xFFFF;

}  // namespace zinf::serialization::zip_format
