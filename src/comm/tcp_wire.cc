#include "comm/tcp_wire.h"

#include <cstring>

#include <fmt/format.h>

#include "core/byte_io.h"
#include "shardpoint/communicator.h"
#include "shardpoint/error.h"

namespace shardpoint::comm::tcp_wire {
namespace {

constexpr std::uint32_t kMagic = 0x43545053;  // "SPTC" little-endian

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kHello: return "join";
    case Kind::kBarrier: return "barrier";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kGather: return "gather";
    case Kind::kAllGather: return "all_gather";
    case Kind::kScatter: return "scatter";
    case Kind::kAllReduceInt: return "all_reduce(int64)";
    case Kind::kAllReduceDouble: return "all_reduce(double)";
    case Kind::kError: return "error";
  }
  return "unknown";
}

std::string encode_header(const Header& h) {
  std::string out;
  out.reserve(kHeaderBytes);
  put_le<std::uint32_t>(out, kMagic);
  put_le<std::uint16_t>(out, static_cast<std::uint16_t>(h.kind));
  put_le<std::uint16_t>(out, h.arg);
  put_le<std::uint64_t>(out, h.seq);
  put_le<std::uint64_t>(out, h.length);
  return out;
}

std::optional<Header> decode_header(const std::byte* p) {
  if (get_le<std::uint32_t>(p) != kMagic) return std::nullopt;
  Header h;
  h.kind = static_cast<Kind>(get_le<std::uint16_t>(p + 4));
  h.arg = get_le<std::uint16_t>(p + 6);
  h.seq = get_le<std::uint64_t>(p + 8);
  h.length = get_le<std::uint64_t>(p + 16);
  return h;
}

std::string describe_collective(Kind kind, std::uint16_t arg, std::uint64_t seq) {
  std::string s = kind_name(kind);
  if (kind == Kind::kBroadcast || kind == Kind::kGather || kind == Kind::kScatter) s += fmt::format("(root {})", arg);
  if (kind == Kind::kAllReduceInt || kind == Kind::kAllReduceDouble) {
    s += fmt::format(" {}", reduce_op_name(static_cast<ReduceOp>(arg)));
  }
  return s + fmt::format(" (collective #{})", seq);
}

std::string encode_strings(const std::vector<std::string>& items) {
  std::size_t total = 8;
  for (const auto& s : items) total += 8 + s.size();
  std::string out;
  out.reserve(total);
  put_le<std::uint64_t>(out, items.size());
  for (const auto& s : items) {
    put_le<std::uint64_t>(out, s.size());
    out += s;
  }
  return out;
}

std::vector<std::string> decode_strings(std::string_view bytes) {
  ByteCursor c(as_bytes(bytes));
  const std::uint64_t n = c.read_le<std::uint64_t>("tcp message: string count");
  if (n > c.remaining() / 8) throw CommError(fmt::format("tcp message: {} strings cannot fit", n));
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t len = c.read_le<std::uint64_t>("tcp message: string length");
    out.emplace_back(as_chars(c.read_bytes(len, "tcp message: string")));
  }
  return out;
}

std::string encode_i64(std::int64_t v) {
  std::string out;
  put_le<std::uint64_t>(out, static_cast<std::uint64_t>(v));
  return out;
}

std::int64_t decode_i64(std::string_view bytes) {
  if (bytes.size() != 8) throw CommError(fmt::format("tcp message: expected 8 bytes, got {}", bytes.size()));
  return static_cast<std::int64_t>(get_le<std::uint64_t>(as_bytes(bytes).data()));
}

std::string encode_double(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return encode_i64(static_cast<std::int64_t>(bits));
}

double decode_double(std::string_view bytes) {
  const auto bits = static_cast<std::uint64_t>(decode_i64(bytes));
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace shardpoint::comm::tcp_wire
