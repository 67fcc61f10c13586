// The pickle opcodes (CPython's Lib/pickle.py names), shared by pickle_reader.cc and
// pickle_writer.cc. Internal to zinf_serialization.
#pragma once

#include <cstdint>

namespace zinf::serialization::pickle_op {

// Protocol 0-1 (text forms are refused by the reader; the binary ones are read).
inline constexpr uint8_t kMark = '(';
inline constexpr uint8_t kStop = '.';
inline constexpr uint8_t kPop = '0';
inline constexpr uint8_t kPopMark = '1';
inline constexpr uint8_t kDup = '2';
inline constexpr uint8_t kFloat = 'F';
inline constexpr uint8_t kInt = 'I';
inline constexpr uint8_t kBinInt = 'J';
inline constexpr uint8_t kBinInt1 = 'K';
inline constexpr uint8_t kLong = 'L';
inline constexpr uint8_t kBinInt2 = 'M';
inline constexpr uint8_t kNone = 'N';
inline constexpr uint8_t kPersId = 'P';
inline constexpr uint8_t kBinPersId = 'Q';
inline constexpr uint8_t kReduce = 'R';
inline constexpr uint8_t kString = 'S';
inline constexpr uint8_t kBinString = 'T';
inline constexpr uint8_t kShortBinString = 'U';
inline constexpr uint8_t kUnicode = 'V';
inline constexpr uint8_t kBinUnicode = 'X';
inline constexpr uint8_t kAppend = 'a';
inline constexpr uint8_t kBuild = 'b';
inline constexpr uint8_t kGlobal = 'c';
inline constexpr uint8_t kDict = 'd';
inline constexpr uint8_t kEmptyDict = '}';
inline constexpr uint8_t kAppends = 'e';
inline constexpr uint8_t kGet = 'g';
inline constexpr uint8_t kBinGet = 'h';
inline constexpr uint8_t kInst = 'i';
inline constexpr uint8_t kLongBinGet = 'j';
inline constexpr uint8_t kList = 'l';
inline constexpr uint8_t kEmptyList = ']';
inline constexpr uint8_t kObj = 'o';
inline constexpr uint8_t kPut = 'p';
inline constexpr uint8_t kBinPut = 'q';
inline constexpr uint8_t kLongBinPut = 'r';
inline constexpr uint8_t kSetItem = 's';
inline constexpr uint8_t kTuple = 't';
inline constexpr uint8_t kEmptyTuple = ')';
inline constexpr uint8_t kSetItems = 'u';
inline constexpr uint8_t kBinFloat = 'G';
// Protocol 2.
inline constexpr uint8_t kProto = 0x80;
inline constexpr uint8_t kNewObj = 0x81;
inline constexpr uint8_t kExt1 = 0x82;
inline constexpr uint8_t kExt2 = 0x83;
inline constexpr uint8_t kExt4 = 0x84;
inline constexpr uint8_t kTuple1 = 0x85;
inline constexpr uint8_t kTuple2 = 0x86;
inline constexpr uint8_t kTuple3 = 0x87;
inline constexpr uint8_t kNewTrue = 0x88;
inline constexpr uint8_t kNewFalse = 0x89;
inline constexpr uint8_t kLong1 = 0x8a;
inline constexpr uint8_t kLong4 = 0x8b;
// Protocol 3.
inline constexpr uint8_t kBinBytes = 'B';
inline constexpr uint8_t kShortBinBytes = 'C';
// Protocol 4.
inline constexpr uint8_t kShortBinUnicode = 0x8c;
inline constexpr uint8_t kBinUnicode8 = 0x8d;
inline constexpr uint8_t kBinBytes8 = 0x8e;
inline constexpr uint8_t kEmptySet = 0x8f;
inline constexpr uint8_t kAddItems = 0x90;
inline constexpr uint8_t kFrozenSet = 0x91;
inline constexpr uint8_t kNewObjEx = 0x92;
inline constexpr uint8_t kStackGlobal = 0x93;
inline constexpr uint8_t kMemoize = 0x94;
inline constexpr uint8_t kFrame = 0x95;
// Protocol 5.
inline constexpr uint8_t kByteArray8 = 0x96;
inline constexpr uint8_t kNextBuffer = 0x97;
inline constexpr uint8_t kReadOnlyBuffer = 0x98;

}  // namespace zinf::serialization::pickle_op
