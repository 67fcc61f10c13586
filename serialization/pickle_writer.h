// write_pickle: serializes a PickleValue tree as pickle protocol 2, the protocol torch.save
// uses for `data.pkl`.
//
// What each kind becomes (as CPython's pickler writes it at protocol 2):
//   None, bool, int, big int, float, str: NONE, NEWTRUE/NEWFALSE, BININT1/BININT2/BININT or
//     LONG1/LONG4, BINFLOAT, BINUNICODE;
//   list, tuple, dict: EMPTY_LIST + APPENDS, EMPTY_TUPLE/TUPLE1-3/TUPLE, EMPTY_DICT + SETITEMS;
//   OrderedDict: collections.OrderedDict() + SETITEMS (+ BUILD of its state);
//   torch.Size: torch.Size((dims,)); set, frozenset: __builtin__.set([items]);
//   bytes: _codecs.encode(latin-1 text, 'latin1'); bytearray: __builtin__.bytearray(...);
//   tensor: torch._utils._rebuild_tensor_v2(persistent id ('storage', torch.<T>Storage, key,
//     location, numel), offset, size, stride, requires_grad, OrderedDict()), wrapped in
//     _rebuild_parameter(tensor, requires_grad, OrderedDict()) for a parameter;
//   storage: its persistent id; global: GLOBAL; object: GLOBAL + args + REDUCE (NEWOBJ when
//     made so) + APPENDS/SETITEMS of its items and entries + BUILD of its state.
// A node reached twice is written once and fetched from the memo after (BINPUT/BINGET), so
// aliasing survives a round trip. torch.load(weights_only=True) of torch 1.13 accepts the
// output when the tree holds only None, bool, int, str, list, tuple, dict, OrderedDict,
// torch.Size and tensors: its restricted unpickler has no BINFLOAT, LONG4, set or bytes.
//
// Errors: SerializationError naming `destination` (offset kNoOffset) for a tree it cannot
// write: a cycle, nesting deeper than 1000, a str over 4 GiB, a global name
// with a newline, an object with keyword arguments (NEWOBJ_EX needs protocol 4), a tensor of
// an unknown dtype.
//
// Thread safety: reentrant; the tree must not change while it is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serialization/pickle_value.h"

namespace zinf::serialization {

[[nodiscard]] std::vector<uint8_t> write_pickle(const PickleValue& root,
                                                const std::string& destination = "<pickle>");

}  // namespace zinf::serialization
