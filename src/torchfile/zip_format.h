// The zip records shardpoint reads and writes, as PyTorch's torch.save lays them out
// (docs/dcp-format.md §5.2). All integers little-endian. Offsets are relative to the
// start of the archive (a whole file, or one blob inside a .distcp file).
//
//   per record, in order:
//     local file header   30 bytes  PK\3\4, needed u16, flags u16, method u16, time u16,
//                                   date u16, crc32 u32, comp size u32, uncomp size u32,
//                                   name len u16, extra len u16
//     name                          UTF-8, "<archive>/<record>"
//     extra fields                  [zip64 0x0001: u16 id, u16 len, {uncomp u64, comp u64}
//                                   when the record is >= 4 GiB, {local header offset u64}
//                                   when the header starts at >= 4 GiB]
//                                   FB 0x4246: u16 id, u16 len, len bytes of 'Z' so that
//                                   the data starts at a multiple of 64 (always present)
//     data                          STORED (method 0)
//     data descriptor     16 bytes  PK\7\8, crc32 u32, comp u32, uncomp u32
//                         24 bytes  PK\7\8, crc32 u32, comp u64, uncomp u64 (zip64 records)
//   central directory, one per record:
//     entry               46 bytes  PK\1\2, made by u16, needed u16, flags u16, method u16,
//                                   time u16, date u16, crc32 u32, comp u32, uncomp u32,
//                                   name len u16, extra len u16, comment len u16,
//                                   disk u16, int attr u16, ext attr u32, local offset u32
//     name, extra (zip64 0x0001 with the fields whose u32 slot is 0xFFFFFFFF), comment
//   zip64 end of central directory   56 bytes  PK\6\6, record size u64 (=44), made by u16,
//                                   needed u16, disk u32, cd disk u32, entries on disk u64,
//                                   entries u64, cd size u64, cd offset u64
//   zip64 locator        20 bytes  PK\6\7, cd disk u32, zip64 EOCD offset u64, disks u32
//   end of central dir   22 bytes  PK\5\6, disk u16, cd disk u16, entries on disk u16,
//                                   entries u16, cd size u32, cd offset u32, comment len u16
//                                   (0xFFFF / 0xFFFFFFFF when the value needs zip64)
//
// These values are on disk: never change them.
#pragma once

#include <cstdint>

namespace shardpoint::torchfile::zip {

inline constexpr std::uint32_t kLocalHeaderSig = 0x04034b50;     // PK\3\4
inline constexpr std::uint32_t kCentralHeaderSig = 0x02014b50;   // PK\1\2
inline constexpr std::uint32_t kDataDescriptorSig = 0x08074b50;  // PK\7\8
inline constexpr std::uint32_t kEocdSig = 0x06054b50;            // PK\5\6
inline constexpr std::uint32_t kEocd64Sig = 0x06064b50;          // PK\6\6
inline constexpr std::uint32_t kEocd64LocatorSig = 0x07064b50;   // PK\6\7

inline constexpr std::uint64_t kLocalHeaderSize = 30;
inline constexpr std::uint64_t kCentralHeaderSize = 46;
inline constexpr std::uint64_t kEocdSize = 22;
inline constexpr std::uint64_t kEocd64Size = 56;
inline constexpr std::uint64_t kEocd64LocatorSize = 20;
inline constexpr std::uint64_t kMaxCommentSize = 0xFFFF;

inline constexpr std::uint16_t kZip64ExtraId = 0x0001;
inline constexpr std::uint16_t kPaddingExtraId = 0x4246;  // "FB"
inline constexpr std::uint16_t kFlagDataDescriptor = 0x0008;
inline constexpr std::uint16_t kFlagUtf8 = 0x0800;
inline constexpr std::uint16_t kMethodStored = 0;

inline constexpr std::uint32_t kU32Max = 0xFFFFFFFF;
inline constexpr std::uint16_t kU16Max = 0xFFFF;

}  // namespace shardpoint::torchfile::zip
