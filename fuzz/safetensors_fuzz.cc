// libFuzzer target: SafetensorsReader on arbitrary bytes. Any input must parse or throw
// SerializationError; parsed tensors must lie inside the input and match their shape x dtype.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "serialization/safetensors.h"
#include "serialization/serialization_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf::serialization;  // NOLINT(google-build-using-namespace)
  try {
    const SafetensorsReader reader =
        SafetensorsReader::from_bytes(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const TensorInfo& tensor : reader.tensors()) {
      const std::span<const uint8_t> bytes = reader.read(tensor.name);
      if (bytes.size() != tensor_bytes("", tensor.name, tensor.dtype, tensor.shape)) std::abort();
      if (!bytes.empty()) sink = sink ^ bytes.front() ^ bytes.back();
    }
  } catch (const SerializationError&) {
  }
  return 0;
}
