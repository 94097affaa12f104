// Byte sources and sinks: the two small interfaces parsers and writers move bytes through,
// and the in-memory implementation of each.
//
// ByteSource is random access over a fixed range (a whole file, or one blob inside a
// .distcp file). Offsets are relative to the start of the source. A source may expose a
// zero-copy view when it is in memory or memory-mapped.
// ByteSink is append-only; position() counts the bytes written so far, so writers record
// offsets without seeking.
// Thread-safety: sources are safe for concurrent reads; sinks are single-writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace shardpoint {

// Borrowed bytes (LevelDB's Slice): valid as long as what it points into.
using ByteSpan = std::span<const std::byte>;

inline ByteSpan as_bytes(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

inline std::string_view as_chars(ByteSpan s) { return {reinterpret_cast<const char*>(s.data()), s.size()}; }

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Name for error messages (a path, "path[offset+length]", ...).
  virtual const std::string& name() const = 0;
  virtual std::uint64_t size() const = 0;
  // Fills out with the bytes at [offset, offset+out.size()). Throws FormatError naming
  // `what` when the range is outside the source; StorageError on I/O failure.
  virtual void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const = 0;
  // A zero-copy view of [offset, offset+length) when the source is in memory; nullopt
  // otherwise. Throws FormatError when the range is outside the source.
  virtual std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const {
    return std::nullopt;
  }
  // Hint: [offset, offset+length) will be read soon, so a driver may start fetching it
  // (a file: posix_fadvise WILLNEED, which queues the reads without waiting). Ranges
  // outside the source are clipped; never throws; the default does nothing.
  virtual void will_need(std::uint64_t offset, std::uint64_t length) const {}
  // Convenience: read into a new buffer (size checked against size() before allocating).
  std::string read_string(std::uint64_t offset, std::uint64_t length, std::string_view what) const;

 protected:
  // Throws FormatError unless [offset, offset+length) lies inside [0, size()).
  void check_range(std::uint64_t offset, std::uint64_t length, std::string_view what) const;
};

// Bytes in memory (not owned: the span must outlive the source).
class MemorySource final : public ByteSource {
 public:
  MemorySource(ByteSpan data, std::string name) : data_(data), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return data_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override;

 private:
  ByteSpan data_;
  std::string name_;
};

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(ByteSpan data) = 0;
  // Writes data as write() does, but a sink may keep reading data after the call instead of
  // copying it now, until the end its class names (StorageWriter: until commit() returns, a
  // call of the writer throws, or the writer is destroyed; a forwarding sink: its target's).
  // REQUIRES: data stays valid and unchanged until then. The default copies (write()).
  virtual void write_borrowed(ByteSpan data) { write(data); }
  // Bytes written so far.
  virtual std::uint64_t position() const = 0;
  void write(std::string_view s) { write(as_bytes(s)); }
};

class StringSink final : public ByteSink {
 public:
  void write(ByteSpan data) override { out_.append(reinterpret_cast<const char*>(data.data()), data.size()); }
  using ByteSink::write;
  std::uint64_t position() const override { return out_.size(); }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace shardpoint
