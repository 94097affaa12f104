#include "shardpoint/location.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include "shardpoint/error.h"

namespace shardpoint {
namespace {

// The position of "://" when text starts with a valid scheme before it, else npos.
std::size_t scheme_end(std::string_view text) {
  const std::size_t pos = text.find("://");
  if (pos == std::string_view::npos || pos == 0) return std::string_view::npos;
  if (!std::isalpha(static_cast<unsigned char>(text[0]))) return std::string_view::npos;
  for (char c : text.substr(0, pos)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return std::string_view::npos;
    }
  }
  return pos;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  return out;
}

// The non-empty, non-"." segments of path joined by '/' (no leading or trailing '/').
std::string join_segments(std::string_view path) {
  std::string out;
  std::size_t i = 0;
  while (i <= path.size()) {
    std::size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view part = path.substr(i, j - i);
    if (!part.empty() && part != ".") {
      if (!out.empty()) out += '/';
      out += part;
    }
    i = j + 1;
  }
  return out;
}

// pathlib's form of a local path: "a//b/./c/" -> "a/b/c", "" and "./" -> ".", "/" -> "/".
std::string normalize_local(std::string_view path) {
  const bool absolute = !path.empty() && path.front() == '/';
  std::string joined = join_segments(path);
  if (absolute) return "/" + joined;
  return joined.empty() ? "." : joined;
}

struct KnownScheme {
  std::string_view name;
  Scheme scheme;
};
constexpr KnownScheme kKnownSchemes[] = {{"memory", Scheme::kMemory}, {"s3", Scheme::kS3},
                                         {"gs", Scheme::kGcs},        {"az", Scheme::kAzure},
                                         {"abfs", Scheme::kAbfs},     {"abfss", Scheme::kAbfss}};

Scheme scheme_of(std::string_view name) {
  for (const KnownScheme& k : kKnownSchemes) {
    if (k.name == name) return k.scheme;
  }
  return Scheme::kOther;
}

// True when path, a URL's path as written, has an empty or "." segment before its last
// non-empty one ("a//b", "./a", "/a"; not "a/" or "a//").
bool has_droppable_segment(std::string_view path) {
  while (path.ends_with('/')) path.remove_suffix(1);
  std::size_t i = 0;
  while (!path.empty() && i <= path.size()) {
    std::size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    const std::string_view part = path.substr(i, j - i);
    if (part.empty() || part == ".") return true;
    i = j + 1;
  }
  return false;
}

}  // namespace

void Location::finish() {
  text_.clear();
  dropped_segments_ = false;
  trailing_slash_ = false;
  canonical_ = is_remote() ? scheme_name_ + "://" + authority_ + (path_.empty() ? "" : "/" + path_) + query_ : path_;
}

std::vector<std::pair<std::string, std::string>> Location::query_options() const {
  std::vector<std::pair<std::string, std::string>> pairs;
  const std::string_view query = std::string_view(query_).substr(query_.empty() ? 0 : 1);
  std::size_t start = 0;
  while (!query.empty() && start <= query.size()) {
    const std::size_t end = query.find('&', start);
    const std::string_view kv = query.substr(start, end == std::string_view::npos ? end : end - start);
    const std::size_t eq = kv.find('=');
    if (kv.empty() || eq == std::string_view::npos || eq == 0) {
      throw UsageError("storage URL \"" + text() + "\": query part \"" + std::string(kv) + "\" is not KEY=VALUE");
    }
    pairs.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return pairs;
}

Location Location::parse(std::string_view text) {
  Location loc;
  const std::size_t end = scheme_end(text);
  if (end == std::string_view::npos) {
    loc.path_ = normalize_local(text);
    loc.finish();
    loc.text_ = std::string(text);
    loc.trailing_slash_ = text.ends_with('/');
    return loc;
  }
  std::string scheme = lowercase(text.substr(0, end));
  std::string_view rest = text.substr(end + 3);
  if (scheme == "file") {
    if (rest.find_first_of("?#") != std::string_view::npos) {
      throw UsageError("storage URL \"" + std::string(text) + "\": file URLs take no query or fragment");
    }
    if (rest.starts_with("localhost/")) rest.remove_prefix(std::string_view("localhost").size());
    if (!rest.starts_with("/")) {
      throw UsageError("storage URL \"" + std::string(text) +
                       "\": expected file:///absolute/path (host must be empty or localhost)");
    }
    loc.path_ = normalize_local(rest);
    loc.finish();
    loc.text_ = std::string(text);
    loc.trailing_slash_ = rest.ends_with('/');
    return loc;
  }
  loc.scheme_ = scheme_of(scheme);
  loc.scheme_name_ = std::move(scheme);
  if (const std::size_t q = rest.find('?'); q != std::string_view::npos) {
    loc.query_ = std::string(rest.substr(q));
    rest = rest.substr(0, q);
  }
  const std::size_t slash = rest.find('/');
  loc.authority_ = std::string(rest.substr(0, slash));
  const std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  loc.path_ = join_segments(path);
  loc.finish();
  loc.text_ = std::string(text);
  loc.dropped_segments_ = has_droppable_segment(path);
  loc.trailing_slash_ = rest.ends_with('/');
  return loc;
}

std::string Location::name() const {
  if (is_remote() ? path_.empty() : (path_ == "." || path_ == "/")) return "";
  const std::size_t slash = path_.rfind('/');
  return slash == std::string::npos ? path_ : path_.substr(slash + 1);
}

std::optional<Location> Location::parent() const {
  if (name().empty()) return std::nullopt;
  Location up = *this;
  const std::size_t slash = path_.rfind('/');
  if (is_remote()) {
    up.path_ = slash == std::string::npos ? std::string() : path_.substr(0, slash);
  } else if (slash == std::string::npos) {
    up.path_ = ".";
  } else {
    up.path_ = slash == 0 ? "/" : path_.substr(0, slash);
  }
  up.finish();
  return up;
}

Location Location::child(std::string_view relative) const {
  const std::string tail = join_segments(relative);
  if (tail.empty()) return canonical();
  Location down = *this;
  if (is_remote()) {
    down.path_ = path_.empty() ? tail : path_ + "/" + tail;
  } else if (path_ == ".") {
    down.path_ = tail;
  } else {
    down.path_ = path_ == "/" ? "/" + tail : path_ + "/" + tail;
  }
  down.finish();
  return down;
}

Location Location::canonical() const {
  Location same = *this;
  same.finish();
  return same;
}

Location Location::absolute() const {
  if (is_remote()) return canonical();
  Location out;
  out.path_ = normalize_local(std::filesystem::absolute(path_).lexically_normal().string());
  out.finish();
  return out;
}

}  // namespace shardpoint
