// Little-endian encoding helpers and a bounds-checked cursor for parsers.
//
// Every read takes (or carries) an end pointer: nothing here reads past the bytes it
// was given. A parser of hostile input uses ByteCursor, whose reads throw FormatError
// naming the offset, the field and how many bytes were needed versus left.
// Never memcpy a struct to disk; encode field by field with put_le().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "shardpoint/byte_stream.h"
#include "shardpoint/error.h"

namespace shardpoint {

// Decodes an unsigned little-endian integer of sizeof(T) bytes at p.
// REQUIRES: p .. p+sizeof(T) is readable.
template <typename T>
T get_le(const std::byte* p) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<U>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  }
  return static_cast<T>(v);
}

// Appends v as sizeof(T) little-endian bytes.
template <typename T>
void put_le(std::string& out, T v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(v);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
}

// Reads fields from [data, data+size) front to back. Each read checks the bytes left
// and throws FormatError("<what> at offset N: needs K bytes, M left") when short.
// `base_offset` is added to reported offsets so errors name the position in the file.
class ByteCursor {
 public:
  explicit ByteCursor(ByteSpan data, std::uint64_t base_offset = 0) : data_(data), base_offset_(base_offset) {}

  std::size_t position() const { return pos_; }
  std::uint64_t file_offset() const { return base_offset_ + pos_; }
  std::size_t remaining() const { return data_.size() - pos_; }
  bool at_end() const { return pos_ == data_.size(); }

  template <typename T>
  T read_le(std::string_view what) {
    require(sizeof(T), what);
    T v = get_le<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }

  std::uint8_t read_u8(std::string_view what) { return read_le<std::uint8_t>(what); }

  // Returns a view of the next n bytes (valid as long as the underlying data).
  ByteSpan read_bytes(std::uint64_t n, std::string_view what) {
    require(n, what);
    ByteSpan s = data_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

  void skip(std::uint64_t n, std::string_view what) { read_bytes(n, what); }

  void seek(std::size_t pos, std::string_view what) {
    if (pos > data_.size()) fail(what, "offset past the end");
    pos_ = pos;
  }

  // Throws FormatError unless n more bytes are available.
  void require(std::uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      throw FormatError(std::string(what) + " at offset " + std::to_string(file_offset()) + ": needs " +
                        std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left");
    }
  }

  [[noreturn]] void fail(std::string_view what, std::string_view detail) const {
    throw FormatError(std::string(what) + " at offset " + std::to_string(file_offset()) + ": " + std::string(detail));
  }

 private:
  ByteSpan data_;
  std::uint64_t base_offset_;
  std::size_t pos_ = 0;
};

}  // namespace shardpoint
