// Fuzzes http::check_range_answer, the check of a server's 206 Content-Range against the
// range asked for. Input: 8 bytes of asked offset, 4 of asked length (at least 1), 4 of body
// bytes, then the header value. Invariants: it never crashes; an accepted answer never
// carries more bytes than were asked for, and a non-empty accepted answer starts at the
// asked offset (Content-Range "bytes F-..." with F the offset, as a number).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "storage/http/http_client.h"

namespace {

template <typename T>
T take(const std::uint8_t*& data, std::size_t& size) {
  T v = 0;
  const std::size_t n = size < sizeof(T) ? size : sizeof(T);
  std::memcpy(&v, data, n);
  data += n;
  size -= n;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  shardpoint::storage::http::ByteRange asked;
  asked.offset = take<std::uint64_t>(data, size) >> 1;  // room for offset + length
  asked.length = std::uint64_t{take<std::uint32_t>(data, size)} + 1;
  const std::uint64_t body = take<std::uint32_t>(data, size);
  const std::string_view header(reinterpret_cast<const char*>(data), size);
  const std::string problem = shardpoint::storage::http::check_range_answer(asked, header, body);
  if (!problem.empty()) return 0;
  if (body > asked.length) {
    std::fprintf(stderr, "accepted %llu body bytes for %llu asked: \"%.*s\"\n", static_cast<unsigned long long>(body),
                 static_cast<unsigned long long>(asked.length), static_cast<int>(header.size()), header.data());
    std::abort();
  }
  // The first position of the answer, as a number ("bytes 010-" is 10).
  std::uint64_t first = 0;
  bool digits = header.starts_with("bytes ");
  std::size_t i = 6;
  for (; digits && i < header.size() && header[i] >= '0' && header[i] <= '9' && i < 6 + 19; ++i) {
    first = first * 10 + static_cast<std::uint64_t>(header[i] - '0');
  }
  digits = digits && i > 6 && i < header.size() && header[i] == '-';
  if (body > 0 && (!digits || first != asked.offset)) {
    std::fprintf(stderr, "accepted data not starting at %llu: \"%.*s\"\n",
                 static_cast<unsigned long long>(asked.offset), static_cast<int>(header.size()), header.data());
    std::abort();
  }
  return 0;
}
