// map_file: a whole file mapped read-only for the token sources of engine/data, through
// serialization's MappedFile (one mapping class for the project). Internal to
// zinf_data.
//
// Errors are DataError: the text of MappedFile's error (the path and the errno text of the
// call that failed, or "not a regular file"), and an empty file is refused too (there are no
// tokens to read).
//
// Thread safety: the returned mapping is immutable; data() may be read from any thread.
#pragma once

#include <string>

#include "serialization/mapped_file.h"

namespace zinf::data::detail {

[[nodiscard]] serialization::MappedFile map_file(const std::string& path);

}  // namespace zinf::data::detail
