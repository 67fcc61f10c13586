// libFuzzer target: read_pickle on arbitrary bytes. Any input must decode or throw
// SerializationError. A decoded tree must be writable, and what write_pickle makes of it must
// decode again and write back to the same bytes (the writer's output is a fixed point).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "serialization/pickle_reader.h"
#include "serialization/pickle_writer.h"
#include "serialization/serialization_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using zinf::serialization::PickleDocument;
  using zinf::serialization::SerializationError;
  std::vector<uint8_t> written;
  try {
    const PickleDocument doc = zinf::serialization::read_pickle({data, size}, "fuzz.pkl");
    written = zinf::serialization::write_pickle(doc.root(), "fuzz.out.pkl");
  } catch (const SerializationError&) {
    return 0;
  }
  const PickleDocument again = zinf::serialization::read_pickle(written, "fuzz.out.pkl");
  if (zinf::serialization::write_pickle(again.root(), "fuzz.again.pkl") != written) std::abort();
  return 0;
}
