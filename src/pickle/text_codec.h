// Text encodings the pickle format uses, over std::string byte buffers. Internal to
// src/pickle.
//
// Python str values are kept as UTF-8 with lone surrogates allowed (Python's
// "surrogatepass" error handler, which BINUNICODE uses): U+D800..U+DFFF are encoded as
// three bytes ED A0..BF xx. Everything else must be well-formed UTF-8.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace shardpoint::pickle {

// Appends code point cp (<= 0x10FFFF; surrogates allowed) as UTF-8.
void append_utf8(std::string& out, char32_t cp);

// Decodes the code point starting at text[pos] and advances pos past it. Returns nullopt
// (pos unchanged) for malformed UTF-8: overlong forms, truncated sequences, values above
// U+10FFFF. Lone surrogates are accepted.
std::optional<char32_t> next_code_point(std::string_view text, std::size_t& pos);

// True when text is UTF-8 under the rules above.
bool is_valid_utf8(std::string_view text);

// Each byte as the code point of the same value, in UTF-8 (Python's bytes.decode('latin1')).
std::string latin1_to_utf8(std::string_view bytes);

// The inverse: nullopt when text is not valid UTF-8 or has a code point above U+00FF.
std::optional<std::string> utf8_to_latin1(std::string_view text);

// Decodes Python's "raw-unicode-escape" codec (the UNICODE opcode of protocol 0): bytes
// are Latin-1 except \uXXXX and \UXXXXXXXX after an odd number of backslashes. Returns
// UTF-8, or nullopt for a malformed escape or a code point above U+10FFFF.
std::optional<std::string> decode_raw_unicode_escape(std::string_view data);

// Decodes Python's codecs.escape_decode (the quoted payload of the STRING opcode):
// \\ \' \" \a \b \f \n \r \t \v, \ooo, \xhh, backslash-newline; unknown escapes stay as
// written. Returns nullopt for a truncated \x escape or a trailing backslash.
std::optional<std::string> decode_string_escape(std::string_view data);

}  // namespace shardpoint::pickle
