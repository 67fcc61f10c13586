#include "engine/data/mapped_file.h"

#include "engine/data/data.h"
#include "serialization/serialization_error.h"

namespace zinf::data::detail {

serialization::MappedFile map_file(const std::string& path) {
  serialization::MappedFile file;
  try {
    file = serialization::MappedFile::open(path);
  } catch (const serialization::SerializationError& e) {
    throw DataError(e.what());
  }
  if (file.size() == 0) {
    throw DataError(path + ": the file is empty (0 bytes): no tokens to read");
  }
  return file;
}

}  // namespace zinf::data::detail
