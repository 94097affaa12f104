#include "pickle/number_text.h"

#include <locale.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace shardpoint::pickle {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// Digits of `text` without the underscores Python allows between digits; nullopt when an
// underscore is leading, trailing or doubled, or a character is not a digit.
std::optional<std::string> strip_digit_underscores(std::string_view text) {
  std::string digits;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '_') {
      if (i == 0 || i + 1 == text.size() || text[i + 1] == '_') return std::nullopt;
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    digits.push_back(c);
  }
  if (digits.empty()) return std::nullopt;
  return digits;
}

// Magnitude as little-endian 32-bit limbs.
using Limbs = std::vector<std::uint32_t>;

void multiply_add(Limbs& limbs, std::uint32_t factor, std::uint32_t addend) {
  std::uint64_t carry = addend;
  for (auto& limb : limbs) {
    std::uint64_t v = static_cast<std::uint64_t>(limb) * factor + carry;
    limb = static_cast<std::uint32_t>(v);
    carry = v >> 32;
  }
  if (carry != 0) limbs.push_back(static_cast<std::uint32_t>(carry));
}

// Divides in place, returns the remainder.
std::uint32_t divide(Limbs& limbs, std::uint32_t divisor) {
  std::uint64_t rem = 0;
  for (std::size_t i = limbs.size(); i-- > 0;) {
    std::uint64_t v = (rem << 32) | limbs[i];
    limbs[i] = static_cast<std::uint32_t>(v / divisor);
    rem = v % divisor;
  }
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  return static_cast<std::uint32_t>(rem);
}

// Two's complement negation of little-endian bytes, in place.
void negate(std::string& le) {
  unsigned carry = 1;
  for (char& c : le) {
    unsigned v = (~static_cast<unsigned char>(c) & 0xFFu) + carry;
    c = static_cast<char>(v & 0xFF);
    carry = v >> 8;
  }
}

std::string trim_sign_extension(std::string le) {
  while (le.size() > 1) {
    auto last = static_cast<unsigned char>(le[le.size() - 1]);
    auto prev = static_cast<unsigned char>(le[le.size() - 2]);
    if ((last == 0x00 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) {
      le.pop_back();
    } else {
      break;
    }
  }
  if (le.size() == 1 && le[0] == 0) le.clear();
  return le;
}

}  // namespace

std::optional<std::string> parse_decimal_int(std::string_view text) {
  text = trim(text);
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  auto digits = strip_digit_underscores(text);
  if (!digits || digits->size() > kMaxIntDigits) return std::nullopt;
  Limbs limbs;
  for (char d : *digits) multiply_add(limbs, 10, static_cast<std::uint32_t>(d - '0'));
  std::string le;
  for (std::uint32_t limb : limbs) {
    for (int i = 0; i < 4; ++i) le.push_back(static_cast<char>((limb >> (8 * i)) & 0xFF));
  }
  le.push_back('\0');  // room for the sign bit
  if (negative) negate(le);
  return trim_sign_extension(std::move(le));
}

std::string format_decimal_int(std::string_view le) {
  if (le.empty()) return "0";
  std::string magnitude(le);
  bool negative = static_cast<unsigned char>(magnitude.back()) & 0x80;
  if (negative) {
    magnitude.push_back(static_cast<char>(0xFF));
    negate(magnitude);
  }
  Limbs limbs((magnitude.size() + 3) / 4, 0);
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    limbs[i / 4] |= static_cast<std::uint32_t>(static_cast<unsigned char>(magnitude[i])) << (8 * (i % 4));
  }
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  std::string reversed;
  while (!limbs.empty()) {
    std::uint32_t chunk = divide(limbs, 1000000000);
    for (int i = 0; i < 9 && (chunk != 0 || !limbs.empty()); ++i) {
      reversed.push_back(static_cast<char>('0' + chunk % 10));
      chunk /= 10;
    }
  }
  if (reversed.empty()) reversed = "0";
  if (negative) reversed.push_back('-');
  return {reversed.rbegin(), reversed.rend()};
}

std::string format_hex_int(std::string_view le) {
  if (le.empty()) return "0x0";
  std::string magnitude(le);
  bool negative = static_cast<unsigned char>(magnitude.back()) & 0x80;
  if (negative) {
    magnitude.push_back(static_cast<char>(0xFF));
    negate(magnitude);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string digits;
  for (std::size_t i = magnitude.size(); i-- > 0;) {
    auto byte = static_cast<unsigned char>(magnitude[i]);
    digits.push_back(kHex[byte >> 4]);
    digits.push_back(kHex[byte & 0xF]);
  }
  std::size_t first = digits.find_first_not_of('0');
  digits = first == std::string::npos ? "0" : digits.substr(first);
  return (negative ? "-0x" : "0x") + digits;
}

namespace {

bool equals_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char c = a[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != b[i]) return false;
  }
  return true;
}

// True for [digits][.digits][(e|E)[sign]digits] with at least one mantissa digit.
bool is_decimal_float(std::string_view s) {
  std::size_t i = 0, mantissa_digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    std::size_t exponent_digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == s.size();
}

}  // namespace

std::optional<double> parse_python_float(std::string_view text) {
  text = trim(text);
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  double value;
  if (equals_ignore_case(text, "inf") || equals_ignore_case(text, "infinity")) {
    value = HUGE_VAL;
  } else if (equals_ignore_case(text, "nan")) {
    value = std::nan("");
  } else {
    // Python allows single underscores between digits; drop them before validating.
    std::string plain;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '_') {
        bool between_digits = i > 0 && i + 1 < text.size() && text[i - 1] >= '0' && text[i - 1] <= '9' &&
                              text[i + 1] >= '0' && text[i + 1] <= '9';
        if (!between_digits) return std::nullopt;
        continue;
      }
      plain.push_back(text[i]);
    }
    if (!is_decimal_float(plain)) return std::nullopt;
    // strtod_l in the C locale: the process locale must not change the decimal point.
    static locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0));
    value = strtod_l(plain.c_str(), nullptr, c_locale);  // overflow -> HUGE_VAL, underflow -> 0
  }
  return negative ? -value : value;
}

std::string format_python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(result.ptr - buf));  // "-1.25e+03"
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  std::size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    std::string magnitude = std::to_string(exponent < 0 ? -exponent : exponent);
    if (magnitude.size() < 2) out.push_back('0');
    return out + magnitude;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  auto int_digits = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

}  // namespace shardpoint::pickle
