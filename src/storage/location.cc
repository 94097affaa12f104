#include "storage/location.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include "shardpoint/error.h"

namespace shardpoint::storage {
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

}  // namespace

Location Location::parse(std::string_view text) {
  Location loc;
  const std::size_t end = scheme_end(text);
  if (end == std::string_view::npos) {
    loc.path_ = normalize_local(text);
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
    return loc;
  }
  loc.scheme_ = std::move(scheme);
  if (const std::size_t q = rest.find('?'); q != std::string_view::npos) {
    loc.query_ = std::string(rest.substr(q));
    rest = rest.substr(0, q);
  }
  const std::size_t slash = rest.find('/');
  loc.bucket_ = std::string(rest.substr(0, slash));
  loc.path_ = slash == std::string_view::npos ? std::string() : join_segments(rest.substr(slash + 1));
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
  return up;
}

Location Location::child(std::string_view relative) const {
  const std::string tail = join_segments(relative);
  if (tail.empty()) return *this;
  Location down = *this;
  if (is_remote()) {
    down.path_ = path_.empty() ? tail : path_ + "/" + tail;
  } else if (path_ == ".") {
    down.path_ = tail;
  } else {
    down.path_ = path_ == "/" ? "/" + tail : path_ + "/" + tail;
  }
  return down;
}

Location Location::absolute() const {
  if (is_remote()) return *this;
  Location out;
  out.path_ = normalize_local(std::filesystem::absolute(path_).lexically_normal().string());
  return out;
}

std::string Location::to_string() const {
  if (!is_remote()) return path_;
  return scheme_ + "://" + bucket_ + (path_.empty() ? "" : "/" + path_) + query_;
}

}  // namespace shardpoint::storage
