#include "pickle/text_codec.h"

#include <cstdint>

namespace shardpoint::pickle {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<char32_t> next_code_point(std::string_view text, std::size_t& pos) {
  if (pos >= text.size()) return std::nullopt;
  auto lead = static_cast<unsigned char>(text[pos]);
  std::size_t length;
  char32_t cp;
  char32_t minimum;
  if (lead < 0x80) {
    ++pos;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2, cp = lead & 0x1F, minimum = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, cp = lead & 0x0F, minimum = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, cp = lead & 0x07, minimum = 0x10000;
  } else {
    return std::nullopt;
  }
  if (text.size() - pos < length) return std::nullopt;
  for (std::size_t i = 1; i < length; ++i) {
    auto byte = static_cast<unsigned char>(text[pos + i]);
    if ((byte & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (byte & 0x3F);
  }
  if (cp < minimum || cp > 0x10FFFF) return std::nullopt;
  pos += length;
  return cp;
}

bool is_valid_utf8(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path: most pickle strings are names and keys.
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    if (!next_code_point(text, pos)) return false;
  }
  return true;
}

std::string latin1_to_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (char c : bytes) append_utf8(out, static_cast<unsigned char>(c));
  return out;
}

std::optional<std::string> utf8_to_latin1(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto cp = next_code_point(text, pos);
    if (!cp || *cp > 0xFF) return std::nullopt;
    out.push_back(static_cast<char>(*cp));
  }
  return out;
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses exactly `count` hex digits at data[pos]; nullopt when short or not hex.
std::optional<std::uint32_t> parse_hex(std::string_view data, std::size_t pos, std::size_t count) {
  if (data.size() - pos < count) return std::nullopt;
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < count; ++i) {
    int d = hex_digit(data[pos + i]);
    if (d < 0) return std::nullopt;
    value = value * 16 + static_cast<std::uint32_t>(d);
  }
  return value;
}

}  // namespace

std::optional<std::string> decode_raw_unicode_escape(std::string_view data) {
  std::string out;
  out.reserve(data.size());
  std::size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] != '\\') {
      append_utf8(out, static_cast<unsigned char>(data[pos++]));
      continue;
    }
    std::size_t run_start = pos;
    while (pos < data.size() && data[pos] == '\\') {
      out.push_back('\\');
      ++pos;
    }
    // Only an odd run of backslashes escapes the following u/U.
    bool odd = (pos - run_start) % 2 == 1;
    if (!odd || pos >= data.size() || (data[pos] != 'u' && data[pos] != 'U')) continue;
    std::size_t digits = data[pos] == 'u' ? 4 : 8;
    auto cp = parse_hex(data, pos + 1, digits);
    if (!cp || *cp > 0x10FFFF) return std::nullopt;
    out.pop_back();  // the escaping backslash
    append_utf8(out, *cp);
    pos += 1 + digits;
  }
  return out;
}

std::optional<std::string> decode_string_escape(std::string_view data) {
  std::string out;
  out.reserve(data.size());
  std::size_t pos = 0;
  while (pos < data.size()) {
    char c = data[pos++];
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (pos >= data.size()) return std::nullopt;  // trailing backslash
    char e = data[pos++];
    switch (e) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': {
        auto value = parse_hex(data, pos, 2);
        if (!value) return std::nullopt;
        out.push_back(static_cast<char>(*value));
        pos += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          unsigned value = static_cast<unsigned>(e - '0');
          for (int i = 0; i < 2 && pos < data.size() && data[pos] >= '0' && data[pos] <= '7'; ++i) {
            value = value * 8 + static_cast<unsigned>(data[pos++] - '0');
          }
          out.push_back(static_cast<char>(value & 0xFF));
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

}  // namespace shardpoint::pickle
