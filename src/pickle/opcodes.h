// Pickle opcode bytes (CPython's Lib/pickletools.py names), shared by reader and writer.
// Internal to src/pickle. These bytes are the on-disk format: never change a value.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardpoint::pickle::op {

// Protocol 0 and 1.
inline constexpr std::uint8_t kMark = '(';
inline constexpr std::uint8_t kStop = '.';
inline constexpr std::uint8_t kPop = '0';
inline constexpr std::uint8_t kPopMark = '1';
inline constexpr std::uint8_t kDup = '2';
inline constexpr std::uint8_t kFloat = 'F';
inline constexpr std::uint8_t kInt = 'I';
inline constexpr std::uint8_t kBinInt = 'J';
inline constexpr std::uint8_t kBinInt1 = 'K';
inline constexpr std::uint8_t kLong = 'L';
inline constexpr std::uint8_t kBinInt2 = 'M';
inline constexpr std::uint8_t kNone = 'N';
inline constexpr std::uint8_t kPersId = 'P';
inline constexpr std::uint8_t kBinPersId = 'Q';
inline constexpr std::uint8_t kReduce = 'R';
inline constexpr std::uint8_t kString = 'S';
inline constexpr std::uint8_t kBinString = 'T';
inline constexpr std::uint8_t kShortBinString = 'U';
inline constexpr std::uint8_t kUnicode = 'V';
inline constexpr std::uint8_t kBinUnicode = 'X';
inline constexpr std::uint8_t kAppend = 'a';
inline constexpr std::uint8_t kBuild = 'b';
inline constexpr std::uint8_t kGlobal = 'c';
inline constexpr std::uint8_t kDict = 'd';
inline constexpr std::uint8_t kEmptyDict = '}';
inline constexpr std::uint8_t kAppends = 'e';
inline constexpr std::uint8_t kGet = 'g';
inline constexpr std::uint8_t kBinGet = 'h';
inline constexpr std::uint8_t kInst = 'i';
inline constexpr std::uint8_t kLongBinGet = 'j';
inline constexpr std::uint8_t kList = 'l';
inline constexpr std::uint8_t kEmptyList = ']';
inline constexpr std::uint8_t kObj = 'o';
inline constexpr std::uint8_t kPut = 'p';
inline constexpr std::uint8_t kBinPut = 'q';
inline constexpr std::uint8_t kLongBinPut = 'r';
inline constexpr std::uint8_t kSetItem = 's';
inline constexpr std::uint8_t kTuple = 't';
inline constexpr std::uint8_t kEmptyTuple = ')';
inline constexpr std::uint8_t kSetItems = 'u';
inline constexpr std::uint8_t kBinFloat = 'G';
// Protocol 2.
inline constexpr std::uint8_t kProto = 0x80;
inline constexpr std::uint8_t kNewObj = 0x81;
inline constexpr std::uint8_t kExt1 = 0x82;
inline constexpr std::uint8_t kExt2 = 0x83;
inline constexpr std::uint8_t kExt4 = 0x84;
inline constexpr std::uint8_t kTuple1 = 0x85;
inline constexpr std::uint8_t kTuple2 = 0x86;
inline constexpr std::uint8_t kTuple3 = 0x87;
inline constexpr std::uint8_t kNewTrue = 0x88;
inline constexpr std::uint8_t kNewFalse = 0x89;
inline constexpr std::uint8_t kLong1 = 0x8a;
inline constexpr std::uint8_t kLong4 = 0x8b;
// Protocol 3.
inline constexpr std::uint8_t kBinBytes = 'B';
inline constexpr std::uint8_t kShortBinBytes = 'C';
// Protocol 4.
inline constexpr std::uint8_t kShortBinUnicode = 0x8c;
inline constexpr std::uint8_t kBinUnicode8 = 0x8d;
inline constexpr std::uint8_t kBinBytes8 = 0x8e;
inline constexpr std::uint8_t kEmptySet = 0x8f;
inline constexpr std::uint8_t kAddItems = 0x90;
inline constexpr std::uint8_t kFrozenSet = 0x91;
inline constexpr std::uint8_t kNewObjEx = 0x92;
inline constexpr std::uint8_t kStackGlobal = 0x93;
inline constexpr std::uint8_t kMemoize = 0x94;
inline constexpr std::uint8_t kFrame = 0x95;
// Protocol 5.
inline constexpr std::uint8_t kByteArray8 = 0x96;
inline constexpr std::uint8_t kNextBuffer = 0x97;
inline constexpr std::uint8_t kReadonlyBuffer = 0x98;

// The highest protocol this implementation reads (CPython 3.8-3.13's HIGHEST_PROTOCOL).
inline constexpr int kHighestProtocol = 5;

// pickletools name of an opcode ("BINUNICODE"), or "" for an unknown byte.
std::string_view opcode_name(std::uint8_t code);

}  // namespace shardpoint::pickle::op
