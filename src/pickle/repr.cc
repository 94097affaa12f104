#include "pickle/repr.h"

#include <unordered_map>

#include "pickle/number_text.h"
#include "pickle/text_codec.h"

namespace shardpoint::pickle {

namespace {

// Deeper levels print as "...". Reads are limited to 2000 levels by default, and the
// char limit usually stops printing long before this.
constexpr std::size_t kMaxReprDepth = 2500;

// Ints whose decimal text would pass CPython's 4300-digit limit print in hex.
constexpr std::size_t kMaxDecimalIntBytes = 1780;

// An approximation of Python's str.isprintable() outside ASCII: controls, separators,
// format characters, surrogates, private use and noncharacters are escaped; unassigned
// code points (which Python also escapes) are not known here and print as themselves.
bool is_printable(char32_t c) {
  if (c < 0xA1) return c >= 0x20 && c < 0x7F;
  if (c == 0xAD || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF)) return false;
  if ((c & 0xFFFE) == 0xFFFE || (c >= 0xFDD0 && c <= 0xFDEF) || c >= 0xF0000) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0x0600 && c <= 0x0605) || c == 0x061C || c == 0x06DD || c == 0x070F || c == 0x180E) return false;
  if ((c >= 0xFFF9 && c <= 0xFFFB) || c == 0x110BD || c == 0x110CD || (c >= 0x1BCA0 && c <= 0x1BCA3)) return false;
  if ((c >= 0x1D173 && c <= 0x1D17A) || (c >= 0xE0000 && c <= 0xE0FFF && !(c >= 0xE0100 && c <= 0xE01EF))) {
    return false;
  }
  return true;
}

void append_hex_escape(std::string& out, char prefix, std::uint32_t value, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('\\');
  out.push_back(prefix);
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out.push_back(kHex[(value >> shift) & 0xF]);
}

// Python's choice: single quotes unless the text has ' and no ".
char pick_quote(std::string_view text) {
  bool single = text.find('\'') != std::string_view::npos;
  bool dbl = text.find('"') != std::string_view::npos;
  return single && !dbl ? '"' : '\'';
}

// Escapes shared by str and bytes reprs; false when c needs a kind-specific escape.
bool append_common(std::string& out, char32_t c, char quote) {
  if (c == static_cast<char32_t>(quote) || c == '\\') {
    out.push_back('\\');
    out.push_back(static_cast<char>(c));
  } else if (c == '\t') {
    out += "\\t";
  } else if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c < 0x20 || c == 0x7F) {
    append_hex_escape(out, 'x', c, 2);
  } else if (c < 0x7F) {
    out.push_back(static_cast<char>(c));
  } else {
    return false;
  }
  return true;
}

void append_str_repr(std::string& out, std::string_view text) {
  char quote = pick_quote(text);
  out.push_back(quote);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t start = pos;
    auto cp = next_code_point(text, pos);
    if (!cp) {  // not from read_pickle (which validates); show the byte
      append_hex_escape(out, 'x', static_cast<unsigned char>(text[pos++]), 2);
      continue;
    }
    if (append_common(out, *cp, quote)) continue;
    if (is_printable(*cp)) {
      out.append(text.substr(start, pos - start));
    } else if (*cp <= 0xFF) {
      append_hex_escape(out, 'x', *cp, 2);
    } else if (*cp <= 0xFFFF) {
      append_hex_escape(out, 'u', *cp, 4);
    } else {
      append_hex_escape(out, 'U', *cp, 8);
    }
  }
  out.push_back(quote);
}

void append_bytes_repr(std::string& out, std::string_view data) {
  char quote = pick_quote(data);
  out.push_back('b');
  out.push_back(quote);
  for (char ch : data) {
    auto c = static_cast<unsigned char>(ch);
    if (!append_common(out, c, quote)) append_hex_escape(out, 'x', c, 2);
  }
  out.push_back(quote);
}

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              static_cast<unsigned char>(c) >= 0x80;
    if (!ok) return false;
  }
  return true;
}

// A dict whose keys can all be written as keyword arguments.
bool is_keyword_dict(const ValuePtr& v) {
  if (!v || !v->is(Kind::kDict)) return false;
  for (const auto& [key, value] : v->entries()) {
    if (!key || !key->is(Kind::kStr) || !is_identifier(key->as_string())) return false;
  }
  return true;
}

bool is_path_class(const Value& callable) {
  if (!callable.is(Kind::kGlobal)) return false;
  if (callable.module() != "pathlib" && callable.module() != "pathlib._local") return false;
  const std::string& n = callable.name();
  return n == "Path" || n == "PosixPath" || n == "WindowsPath" || n == "PurePath" || n == "PurePosixPath" ||
         n == "PureWindowsPath";
}

bool is_plain_call(const Value& v) {
  return v.call_kind() == CallKind::kReduce && v.items().empty() && v.entries().empty() && !v.state() && v.args() &&
         v.args()->is(Kind::kTuple);
}

class Printer {
 public:
  explicit Printer(const ReprOptions& options) : max_chars_(options.max_chars), node_text_(options.node_text) {}

  std::string finish() {
    if (out_.size() <= max_chars_) return std::move(out_);
    std::size_t cut = max_chars_;
    // Cut on a character boundary, not inside a UTF-8 sequence.
    while (cut > 0 && (static_cast<unsigned char>(out_[cut]) & 0xC0) == 0x80) --cut;
    out_.resize(cut);
    return out_ + "...";
  }

  void print(const ValuePtr& v, std::size_t depth) {
    if (!v) {
      out_ += "<null>";
      return;
    }
    print(*v, depth);
  }

  void print(const Value& v, std::size_t depth) {
    if (full()) return;
    if (depth > kMaxReprDepth) {
      out_ += "...";
      return;
    }
    if (active_.contains(&v)) {
      print_recursion(v);
      return;
    }
    if (node_text_) {
      if (std::optional<std::string> text = node_text_(v)) {
        out_ += *text;
        return;
      }
    }
    ++active_[&v];
    print_kind(v, depth);
    if (--active_[&v] == 0) active_.erase(&v);
  }

 private:
  bool full() const { return out_.size() > max_chars_; }

  // What Python prints for a container met again while printing itself.
  void print_recursion(const Value& v) {
    switch (v.kind()) {
      case Kind::kList: out_ += "[...]"; return;
      case Kind::kDict: out_ += "{...}"; return;
      case Kind::kTuple: out_ += "(...)"; return;
      case Kind::kSet: out_ += "set(...)"; return;
      case Kind::kFrozenSet: out_ += "frozenset(...)"; return;
      default: out_ += "..."; return;
    }
  }

  void print_kind(const Value& v, std::size_t depth) {
    switch (v.kind()) {
      case Kind::kNone: out_ += "None"; return;
      case Kind::kBool: out_ += v.as_bool() ? "True" : "False"; return;
      case Kind::kInt: print_int(v); return;
      case Kind::kFloat: out_ += format_python_float(v.as_float()); return;
      case Kind::kStr: append_str_repr(out_, v.as_string()); return;
      case Kind::kBytes: append_bytes_repr(out_, v.as_string()); return;
      case Kind::kByteArray:
        out_ += "bytearray(";
        append_bytes_repr(out_, v.as_string());
        out_ += ")";
        return;
      case Kind::kTuple:
        out_ += "(";
        print_items(v.items(), depth);
        out_ += v.items().size() == 1 ? ",)" : ")";
        return;
      case Kind::kList: print_bracketed("[", v.items(), "]", depth); return;
      case Kind::kDict:
        out_ += "{";
        print_entries(v.entries(), depth);
        out_ += "}";
        return;
      case Kind::kSet:
        if (v.items().empty()) out_ += "set()";
        else print_bracketed("{", v.items(), "}", depth);
        return;
      case Kind::kFrozenSet:
        if (v.items().empty()) out_ += "frozenset()";
        else print_bracketed("frozenset({", v.items(), "})", depth);
        return;
      case Kind::kGlobal: out_ += v.module() + "." + v.name(); return;
      case Kind::kObject: print_object(v, depth); return;
      case Kind::kPersistentId:
        out_ += "persistent_id(";
        print(v.pid(), depth + 1);
        out_ += ")";
        return;
    }
  }

  void print_int(const Value& v) {
    if (v.int_fits_int64()) {
      out_ += std::to_string(v.as_int());
      return;
    }
    std::string le = v.int_le_bytes();
    out_ += le.size() <= kMaxDecimalIntBytes ? format_decimal_int(le) : format_hex_int(le);
  }

  void print_bracketed(const char* open, const std::vector<ValuePtr>& items, const char* close, std::size_t depth) {
    out_ += open;
    print_items(items, depth);
    out_ += close;
  }

  void print_items(const std::vector<ValuePtr>& items, std::size_t depth) {
    for (std::size_t i = 0; i < items.size() && !full(); ++i) {
      if (i > 0) out_ += ", ";
      print(items[i], depth + 1);
    }
  }

  void print_entries(const DictEntries& entries, std::size_t depth) {
    for (std::size_t i = 0; i < entries.size() && !full(); ++i) {
      if (i > 0) out_ += ", ";
      print(entries[i].first, depth + 1);
      out_ += ": ";
      print(entries[i].second, depth + 1);
    }
  }

  // Keyword arguments from a dict of identifier keys: "a=1, b=2".
  void print_keywords(const DictEntries& entries, std::size_t depth, bool& first) {
    for (const auto& [key, value] : entries) {
      if (full()) return;
      if (!first) out_ += ", ";
      first = false;
      out_ += key->as_string() + "=";
      print(value, depth + 1);
    }
  }

  void separate(bool& first) {
    if (!first) out_ += ", ";
    first = false;
  }

  // An object as the call that builds it: callable(args, [appended items],
  // [(key, value) pairs set], state as keywords when it is a dict of names).
  void print_object(const Value& v, std::size_t depth) {
    if (print_special_object(v, depth)) return;
    print(v.callable(), depth + 1);
    out_ += "(";
    bool first = true;
    if (v.args() && v.args()->is(Kind::kTuple)) {
      for (const auto& arg : v.args()->items()) {
        if (full()) return;
        separate(first);
        print(arg, depth + 1);
      }
    }
    if (v.kwargs()) {
      if (is_keyword_dict(v.kwargs())) {
        print_keywords(v.kwargs()->entries(), depth, first);
      } else {
        separate(first);
        out_ += "**";
        print(v.kwargs(), depth + 1);
      }
    }
    if (!v.items().empty()) {
      separate(first);
      print_bracketed("[", v.items(), "]", depth);
    }
    if (!v.entries().empty()) print_pairs(v.entries(), depth, first);
    if (v.state()) {
      if (is_keyword_dict(v.state())) {
        print_keywords(v.state()->entries(), depth, first);
      } else {
        separate(first);
        out_ += "state=";
        print(v.state(), depth + 1);
      }
    }
    out_ += ")";
  }

  void print_pairs(const DictEntries& entries, std::size_t depth, bool& first) {
    separate(first);
    out_ += "[";
    for (std::size_t i = 0; i < entries.size() && !full(); ++i) {
      if (i > 0) out_ += ", ";
      out_ += "(";
      print(entries[i].first, depth + 1);
      out_ += ", ";
      print(entries[i].second, depth + 1);
      out_ += ")";
    }
    out_ += "]";
  }

  // getattr(Class, 'NAME') prints as Class.NAME (enum members on Python >= 3.11), and a
  // pathlib path as one string: pathlib.PosixPath('/a/b').
  bool print_special_object(const Value& v, std::size_t depth) {
    if (!is_plain_call(v) || !v.callable()) return false;
    const Value& callable = *v.callable();
    const auto& args = v.args()->items();
    if (callable.is_global("builtins", "getattr") && args.size() == 2 && args[0] && args[1] &&
        args[0]->is(Kind::kGlobal) && args[1]->is(Kind::kStr) && is_identifier(args[1]->as_string())) {
      print(args[0], depth + 1);
      out_ += "." + args[1]->as_string();
      return true;
    }
    if (is_path_class(callable)) {
      std::string path;
      char separator = callable.name().find("Windows") != std::string::npos ? '\\' : '/';
      for (const auto& part : args) {
        if (!part || !part->is(Kind::kStr)) return false;
        if (!path.empty() && path.back() != '/' && path.back() != '\\') path.push_back(separator);
        path += part->as_string();
      }
      out_ += callable.module() + "." + callable.name() + "(";
      append_str_repr(out_, path.empty() ? "." : path);
      out_ += ")";
      return true;
    }
    return false;
  }

  std::size_t max_chars_;
  const std::function<std::optional<std::string>(const Value&)>& node_text_;
  std::string out_;
  std::unordered_map<const Value*, int> active_;
};

}  // namespace

std::string repr(const Value& value, const ReprOptions& options) {
  Printer printer(options);
  printer.print(value, 0);
  return printer.finish();
}

}  // namespace shardpoint::pickle
