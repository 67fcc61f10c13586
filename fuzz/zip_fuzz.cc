// libFuzzer target: ZipReader on arbitrary bytes. Any input must parse or throw
// SerializationError; parsed records must lie inside the input (checked by touching their
// first and last bytes, which ASan turns into a report when they do not).
#include <cstddef>
#include <cstdint>
#include <span>

#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using zinf::serialization::SerializationError;
  using zinf::serialization::ZipReader;
  const std::span<const uint8_t> bytes(data, size);
  for (const bool verify_crc : {false, true}) {
    try {
      const ZipReader reader = ZipReader::from_bytes(bytes, "fuzz.zip", {.verify_crc = verify_crc});
      volatile uint8_t sink = 0;
      for (const auto& entry : reader.entries()) {
        const std::span<const uint8_t> record = reader.read(entry.name);
        if (!record.empty()) sink = sink ^ record.front() ^ record.back();
      }
    } catch (const SerializationError&) {
    }
  }
  return 0;
}
