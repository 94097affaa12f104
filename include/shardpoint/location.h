// Location: where a checkpoint, a file or an object lives, parsed once from what the user
// wrote: a local path ("ckpt", "/data/ckpt", "file:///data/ckpt") or a storage URL
// ("s3://bucket/prefix", "gs://b/p", "az://container/p", "abfs[s]://c@acct.dfs.core.windows.net/p",
// "memory://name/p", any "scheme://" a registered driver takes). Text is parsed where it enters
// (a CLI argument, a C API call, Python through the C API) and carried as a Location after
// that: open_storage() dispatches on scheme(), and each driver checks the parsed pieces
// (bucket names, forbidden segments, query keys) against its own rules. This is the only
// URL parser of the library.
//
// Parsing rules:
//   - A URL is "<scheme>://<rest>" where scheme is a letter followed by letters, digits,
//     '+', '-' or '.' (RFC 3986), compared case-insensitively and kept lowercase. Anything
//     else (no "://", an empty or invalid scheme: "://x", "a b://x") is a local path.
//   - "file://" URLs are local paths: "file:///abs" and "file://localhost/abs" are "/abs".
//   - URL: <rest> is "<authority>[/<path>][?<query>]"; authority is everything up to the
//     first '/' (a bucket, container, "container@account.dfs..." or memory namespace), query
//     everything from the first '?', kept as written with the '?'.
//   - Paths are normalised the way Python's pathlib does: empty and "." segments are
//     dropped, ".." is kept (it is not resolved: a symlink may stand before it). A local
//     path keeps its leading '/'; "" and "./" are "."; "/" stays "/". A URL path has no
//     leading or trailing '/' ("" at the authority's root).
// A Location is a value: parse(to_string(x)) == x.
//
// Thread-safety: an immutable value; const methods may be called from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardpoint {

// The schemes the library knows by name. kOther is any other valid scheme (a driver an
// application registered); Location::scheme_name() gives its text. Not persisted.
enum class Scheme {
  kFile,    // a local path or file:// URL
  kMemory,  // memory://name (process-wide, tests and tools)
  kS3,      // s3://bucket/prefix
  kGcs,     // gs://bucket/prefix
  kAzure,   // az://container/prefix
  kAbfs,    // abfs://container@account.dfs.core.windows.net/prefix
  kAbfss,   // abfss://container@account.dfs.core.windows.net/prefix
  kOther,
};

class Location {
 public:
  // The local path ".".
  Location() = default;

  // Parses a path or URL (rules above). Does no I/O. Throws UsageError, one line naming the
  // text, for a file URL that names another host or carries a query or fragment (what the
  // local driver would refuse); any other text parses.
  static Location parse(std::string_view text);

  Scheme scheme() const { return scheme_; }
  // The lowercase scheme: "file" for a local path, "s3", or an application's scheme.
  const std::string& scheme_name() const { return scheme_name_; }
  // True for a URL other than file:// (an object store or memory://).
  bool is_remote() const { return scheme_ != Scheme::kFile; }
  // The URL's authority: bucket, container ("c@acct.dfs.core.windows.net" for abfs) or
  // memory namespace; "" for a local path.
  const std::string& authority() const { return authority_; }
  // The normalised path: the local path, or the key prefix under the authority.
  const std::string& path() const { return path_; }
  // "?a=b" as written (URLs only; "" when absent).
  const std::string& query() const { return query_; }
  // The query split into KEY=VALUE pairs in order, values as written (no percent-decoding;
  // "" gives none). Throws UsageError naming the URL for a part that is not KEY=VALUE.
  std::vector<std::pair<std::string, std::string>> query_options() const;

  // The text parse() was given, for error messages (a location derived with parent(),
  // child() or absolute() gives its to_string()). Not part of the value: operator==
  // ignores it.
  const std::string& text() const { return text_.empty() ? canonical_ : text_; }
  // True when parse() dropped empty or "." segments from a URL's path as written ("a//b",
  // "./a"; trailing '/' do not count). Object-store drivers refuse such URLs. Not part of
  // the value.
  bool dropped_segments() const { return dropped_segments_; }
  // True when the path as parse() was given it ends with '/' ("s3://b/p/", "ckpt/"): the
  // writer meant a folder or prefix, not an object. Not part of the value.
  bool trailing_slash() const { return trailing_slash_; }

  // The last path segment ("x.pt" of "s3://b/p/x.pt", "ckpt" of "/data/ckpt"); "" when
  // there is none (an authority's root, "/", ".").
  std::string name() const;
  // The folder or prefix holding this one (the query stays with it): "/data" for
  // "/data/ckpt", "." for "ckpt", "/" for "/x", "s3://b?q" for "s3://b/x?q". nullopt for
  // an authority's root, "/" and ".".
  std::optional<Location> parent() const;
  // This location joined with a relative path (normalised; "." and "" give *this). For "."
  // the child of a local "." is "x", not "./x". REQUIRES relative does not start with '/'.
  Location child(std::string_view relative) const;
  // A local path made absolute against the working directory, with ".." resolved
  // lexically (std::filesystem::lexically_normal); a URL is returned unchanged.
  Location absolute() const;

  // The same location as if parsed from to_string(): text() gives to_string(),
  // dropped_segments() and trailing_slash() are false (for callers that normalise on purpose).
  Location canonical() const;

  // The canonical text: the local path, or "<scheme>://<authority>[/<path>][<query>]".
  const std::string& to_string() const { return canonical_; }

  // Equal scheme, authority, path and query.
  bool operator==(const Location& other) const { return canonical_ == other.canonical_; }

 private:
  void finish();  // sets canonical_ from the parts

  Scheme scheme_ = Scheme::kFile;
  std::string scheme_name_ = "file";
  std::string authority_;
  std::string path_ = ".";
  std::string query_;
  std::string canonical_ = ".";
  std::string text_;
  bool dropped_segments_ = false;
  bool trailing_slash_ = false;
};

}  // namespace shardpoint
