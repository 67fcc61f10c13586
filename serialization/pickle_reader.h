// read_pickle: a pickle interpreter (protocols 2 to 5) that builds a PickleValue tree and
// never executes, imports or looks anything up.
//
// It understands every opcode Python's pickler and torch.save emit at protocols 2-5 for the
// values of a checkpoint (see pickle_value.h for the kinds), and recognises a few globals by
// name, without calling them: collections.OrderedDict, builtins set/frozenset/bytearray/bytes,
// _codecs.encode (protocol 2's bytes), torch.Size, and torch._utils._rebuild_tensor(_v2) /
// _rebuild_parameter(_with_state) over ('storage', torch.<T>Storage, key, location, numel)
// persistent ids. Any other global stays an opaque Global, and any other call an Object.
// The Python 2 module names of protocol 2 (__builtin__, copy_reg) read as Python 3's.
// Refused with a message: out-of-band buffers (NEXT_BUFFER, READONLY_BUFFER), the extension
// registry (EXT1/2/4) and the text opcodes of protocols 0-1 (INT, STRING, GET, INST, ...).
//
// Errors: any malformed input (truncated, unknown opcode, stack underflow, missing MARK, bad
// memo reference, wrong argument types, a tensor view outside its storage, nesting deeper than
// max_depth, cycles) throws SerializationError naming `source`, the byte offset of the opcode
// and the opcode. Memory stays proportional to the input: every node costs at least one input
// byte, lengths are checked against the bytes left before anything is allocated, and the
// copies recognised calls make of memoized arguments (set(list), torch.Size(tuple), ...) are
// capped at 16 times the input size.
//
// Thread safety: read_pickle is reentrant; calls on different data may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "serialization/pickle_value.h"

namespace zinf::serialization {

struct PickleReadOptions {
  // Deepest nesting of values (and of MARKs) accepted.
  size_t max_depth = 1000;
};

// Decodes the pickle in `data` (for a torch archive: the bytes of `data.pkl`). `source`
// names the data in errors. Bytes after STOP are ignored, as Python does.
[[nodiscard]] PickleDocument read_pickle(std::span<const uint8_t> data, std::string source,
                                         const PickleReadOptions& options = {});

// The opcode's name ("BINUNICODE") or "unknown".
[[nodiscard]] const char* pickle_opcode_name(uint8_t opcode);

}  // namespace zinf::serialization
