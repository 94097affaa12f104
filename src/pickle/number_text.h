// Decimal text of Python ints and floats, as protocol 0 pickles and repr() write them.
// Internal to src/pickle.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace shardpoint::pickle {

// CPython refuses int<->decimal conversions longer than this (sys.int_info
// .default_max_str_digits) because they are quadratic; so do we.
inline constexpr std::size_t kMaxIntDigits = 4300;

// Parses Python int() text in base 10: optional surrounding whitespace, optional sign,
// digits with single underscores between them. Returns the value as minimal little-endian
// two's complement bytes (the LONG1 payload; "" for zero), or nullopt when malformed or
// longer than kMaxIntDigits.
std::optional<std::string> parse_decimal_int(std::string_view text);

// Decimal text of little-endian two's complement bytes ("" is 0).
// REQUIRES: le.size() small enough for quadratic work (callers cap it).
std::string format_decimal_int(std::string_view le);

// Hexadecimal text of the same ("0x1f", "-0x80"), linear time for ints of any size.
std::string format_hex_int(std::string_view le);

// Parses Python float() text: optional surrounding whitespace and sign, decimal or
// exponent notation, inf/infinity/nan in any case. Out-of-range values become +-inf or
// +-0 as in Python. nullopt when malformed.
std::optional<double> parse_python_float(std::string_view text);

// Python's repr(float): shortest text that round-trips, fixed notation for exponents
// -4..15 ("1.5", "100.0", "0.0001"), otherwise exponent notation ("1e-05", "1.5e+16");
// "inf", "-inf", "nan".
std::string format_python_float(double value);

}  // namespace shardpoint::pickle
