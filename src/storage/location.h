// Location: where a checkpoint, a file or an object lives, parsed once from what the user
// wrote: a local path ("ckpt", "/data/ckpt", "file:///data/ckpt") or a storage URL
// ("s3://bucket/prefix", "gs://b/p", "az://container/p", "abfs[s]://c@acct.dfs.core.windows.net/p",
// "memory://name/p", any "scheme://" open_storage() may know). Every layer that asks "is
// this remote?", "what is its parent?" or "what is this name under it?" asks a Location.
//
// Parsing rules:
//   - A URL is "<scheme>://<rest>" where scheme is a letter followed by letters, digits,
//     '+', '-' or '.' (RFC 3986), compared case-insensitively and kept lowercase. Anything
//     else (no "://", an empty or invalid scheme: "://x", "a b://x") is a local path.
//   - "file://" URLs are local paths: "file:///abs" and "file://localhost/abs" are "/abs".
//   - URL: <rest> is "<bucket>[/<path>][?<query>]"; bucket is everything up to the first
//     '/' (a bucket, container, "container@account.dfs..." or memory namespace), query
//     everything from the first '?', kept as written with the '?'.
//   - Paths are normalised the way Python's pathlib does: empty and "." segments are
//     dropped, ".." is kept (it is not resolved: a symlink may stand before it). A local
//     path keeps its leading '/'; "" and "./" are "."; "/" stays "/". A URL path has no
//     leading or trailing '/' ("" at the bucket root).
// A Location is a value: parse(to_string(x)) == x. The drivers still check the parts
// against their own rules (bucket names, forbidden segments) when the storage is opened.
//
// Thread-safety: immutable value; const methods may be called from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shardpoint::storage {

class Location {
 public:
  // The local path ".".
  Location() = default;

  // Parses a path or URL (rules above). Throws UsageError for a file URL that names
  // another host or carries a query or fragment (what open_storage() would refuse).
  static Location parse(std::string_view text);

  // True for a URL other than file:// (an object store or memory://).
  bool is_remote() const { return !scheme_.empty(); }
  // The lowercase scheme of a URL ("s3"); "" for a local path.
  const std::string& scheme() const { return scheme_; }
  // The URL's authority: bucket, container ("c@acct.dfs.core.windows.net" for abfs) or
  // memory namespace; "" for a local path.
  const std::string& bucket() const { return bucket_; }
  // The normalised path: the local path, or the key prefix under the bucket.
  const std::string& path() const { return path_; }
  // "?a=b" as written (URLs only; "" when absent).
  const std::string& query() const { return query_; }

  // The last path segment ("x.pt" of "s3://b/p/x.pt", "ckpt" of "/data/ckpt"); "" when
  // there is none (a bucket root, "/", ".").
  std::string name() const;
  // The folder or prefix holding this one (the query stays with it): "/data" for
  // "/data/ckpt", "." for "ckpt", "/" for "/x", "s3://b?q" for "s3://b/x?q". nullopt for
  // a bucket root, "/" and ".".
  std::optional<Location> parent() const;
  // This location joined with a relative path (normalised; "." and "" give *this). For "."
  // the child of a local "." is "x", not "./x". REQUIRES relative does not start with '/'.
  Location child(std::string_view relative) const;
  // A local path made absolute against the working directory, with ".." resolved
  // lexically (std::filesystem::lexically_normal); a URL is returned unchanged.
  Location absolute() const;

  // The canonical text: the local path, or "<scheme>://<bucket>[/<path>][<query>]".
  std::string to_string() const;

  bool operator==(const Location&) const = default;

 private:
  std::string scheme_;
  std::string bucket_;
  std::string path_ = ".";
  std::string query_;
};

}  // namespace shardpoint::storage
