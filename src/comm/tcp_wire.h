// The TCP communicator's wire format (tcp_communicator.h): every message is a 24-byte
// header and a payload. Header, little-endian:
//   u32 magic "SPTC" (0x43545053)   u16 kind   u16 arg (root, or the reduce op)
//   u64 seq (which collective of the sequence; 0 while joining)   u64 payload length
// Payloads: kHello: u32 rank, u32 world size; kGather / kAllGather / kScatter: a string
// list (u64 count, then u64 length + bytes each); all_reduce: one i64 or one IEEE double
// (its bits as u64); kError: the reason as text.
//
// Kind values travel between processes of one job, which may run different builds:
// existing values must never change.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardpoint::comm::tcp_wire {

inline constexpr std::size_t kHeaderBytes = 24;

// What a message is; the collectives double as the check that all ranks called the same one.
enum class Kind : std::uint16_t {
  kHello = 1,  // joining: payload u32 rank, u32 world size; rank 0 answers kHello when all joined
  kBarrier,
  kBroadcast,
  kGather,
  kAllGather,
  kScatter,
  kAllReduceInt,
  kAllReduceDouble,
  kError = 0xEE,  // rank 0 -> rank: the collective failed; payload is why
};

// "barrier", "all_reduce(int64)", ...; "unknown" for a value not listed.
const char* kind_name(Kind k);

struct Header {
  Kind kind = Kind::kBarrier;
  std::uint16_t arg = 0;  // root, or the reduce op
  std::uint64_t seq = 0;  // which collective of the sequence (0 = joining)
  std::uint64_t length = 0;
  bool operator==(const Header&) const = default;
};

// kHeaderBytes bytes.
std::string encode_header(const Header& h);
// Decodes kHeaderBytes bytes at p (REQUIRES that many are readable); nullopt when they do
// not start with the magic (not one of ours). The kind is not checked.
std::optional<Header> decode_header(const std::byte* p);

// "broadcast(root 2) (collective #7)": a collective for error messages.
std::string describe_collective(Kind kind, std::uint16_t arg, std::uint64_t seq);

// A string list payload. decode_strings throws CommError for a count that cannot fit in
// the bytes that follow and FormatError (naming what is short) for a truncated string;
// trailing bytes are ignored.
std::string encode_strings(const std::vector<std::string>& items);
std::vector<std::string> decode_strings(std::string_view bytes);

// 8-byte payloads. The decoders throw CommError unless given exactly 8 bytes.
std::string encode_i64(std::int64_t v);
std::int64_t decode_i64(std::string_view bytes);
std::string encode_double(double v);
double decode_double(std::string_view bytes);

}  // namespace shardpoint::comm::tcp_wire
