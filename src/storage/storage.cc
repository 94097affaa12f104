#include "shardpoint/storage.h"

#include "shardpoint/error.h"

namespace shardpoint::storage {
namespace {

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

[[noreturn]] void bad_key(std::string_view what, std::string_view key, std::string_view why) {
  throw UsageError("invalid storage " + std::string(what) + " " + quoted(key) + ": " + std::string(why) +
                   " (keys are relative paths inside the storage root, like \"dir/__0_0.distcp\")");
}

// Checks the '/'-separated segments of s. In a prefix the last segment may be partial
// ("__0_", "." of ".metadata") or empty (trailing '/'), so it is not checked.
void check_segments(std::string_view what, std::string_view s, bool is_prefix) {
  if (s.front() == '/') bad_key(what, s, "absolute paths are not allowed");
  if (s.find('\0') != std::string_view::npos) bad_key(what, s, "NUL byte");
  if (s.find(kTempMarker) != std::string_view::npos) {
    bad_key(what, s, "\"" + std::string(kTempMarker) + "\" is reserved for temporary files");
  }
  std::size_t start = 0;
  while (true) {
    std::size_t end = s.find('/', start);
    std::string_view seg = s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    bool last = end == std::string_view::npos;
    if (last && is_prefix) break;
    if (seg.empty()) bad_key(what, s, "empty path segment");
    if (seg == ".") bad_key(what, s, "segment \".\" is not allowed");
    if (seg == "..") bad_key(what, s, "segment \"..\" is not allowed");
    if (last) break;
    start = end + 1;
  }
}

}  // namespace

void check_io(const IoOptions& io, std::string_view what) {
  if (io.stop.stop_requested()) {
    throw StorageError(StorageError::Kind::kOther, std::string(what) + ": cancelled");
  }
  if (io.deadline != Clock::time_point::max() && Clock::now() >= io.deadline) {
    throw StorageError(StorageError::Kind::kTransient, std::string(what) + ": deadline exceeded");
  }
}

void validate_key(std::string_view key) {
  if (key.empty()) bad_key("key", key, "empty key");
  check_segments("key", key, /*is_prefix=*/false);
}

void validate_prefix(std::string_view prefix) {
  if (prefix.empty()) return;
  check_segments("prefix", prefix, /*is_prefix=*/true);
}

void StorageWriter::write_at(std::uint64_t offset, ByteSpan data, const IoOptions& io) {
  throw UsageError("write_at \"" + key() +
                   "\": this storage does not support parallel writes (features().parallel_writes)");
}

std::optional<std::string> Storage::try_read_all(std::string_view key, const IoOptions& io) {
  std::optional<std::uint64_t> size = try_stat(key, io);
  if (!size) return std::nullopt;
  std::string bytes(static_cast<std::size_t>(*size), '\0');
  read(key, 0, std::as_writable_bytes(std::span<char>(bytes)), io);
  return bytes;
}

std::optional<std::uint64_t> Storage::try_stat(std::string_view key, const IoOptions& io) {
  try {
    return stat(key, io);
  } catch (const StorageError& e) {
    if (e.kind() == StorageError::Kind::kNotFound) return std::nullopt;
    throw;
  }
}

}  // namespace shardpoint::storage
