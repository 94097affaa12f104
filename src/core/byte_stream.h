// Byte sources and sinks: the two small interfaces parsers and writers move bytes through.
//
// ByteSource is random access over a fixed range (a whole file, or one blob inside a
// .distcp file). Offsets are relative to the start of the source. A source may expose a
// zero-copy view when it is memory-mapped.
// ByteSink is append-only; position() counts the bytes written so far, so writers record
// offsets without seeking.
// Implementations here: MemorySource / FileSource / MappedSource (a window of a mapping),
// StringSink / FileSink (buffered, pwrite at increasing offsets).
// Thread-safety: sources are safe for concurrent reads; sinks are single-writer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "core/mapped_region.h"
#include "core/unique_fd.h"

namespace shardpoint {

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
  virtual std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length,
                                       std::string_view what) const {
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
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length,
                               std::string_view what) const override;

 private:
  ByteSpan data_;
  std::string name_;
};

// A window [base, base+length) of a file read with pread. Shares the descriptor.
class FileSource final : public ByteSource {
 public:
  // Whole file.
  static std::unique_ptr<FileSource> open(const std::string& path);
  FileSource(std::shared_ptr<const UniqueFd> fd, std::uint64_t base, std::uint64_t length, std::string name)
      : fd_(std::move(fd)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  void will_need(std::uint64_t offset, std::uint64_t length) const override;
  // A sub-window of this source, sharing the descriptor.
  std::unique_ptr<FileSource> window(std::uint64_t offset, std::uint64_t length, std::string name) const;

 private:
  std::shared_ptr<const UniqueFd> fd_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
};

// A window of a shared memory mapping.
class MappedSource final : public ByteSource {
 public:
  static std::unique_ptr<MappedSource> open(const std::string& path);
  MappedSource(std::shared_ptr<const MappedRegion> region, std::uint64_t base, std::uint64_t length,
               std::string name)
      : region_(std::move(region)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length,
                               std::string_view what) const override;
  std::unique_ptr<MappedSource> window(std::uint64_t offset, std::uint64_t length, std::string name) const;
  const std::shared_ptr<const MappedRegion>& region() const { return region_; }
  std::uint64_t base() const { return base_; }

 private:
  std::shared_ptr<const MappedRegion> region_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
};

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(ByteSpan data) = 0;
  // Bytes written so far.
  virtual std::uint64_t position() const = 0;
  void write(std::string_view s) { write(as_bytes(s)); }
};

class StringSink final : public ByteSink {
 public:
  void write(ByteSpan data) override {
    out_.append(reinterpret_cast<const char*>(data.data()), data.size());
  }
  using ByteSink::write;
  std::uint64_t position() const override { return out_.size(); }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Appends to a file descriptor starting at `start_offset`, through a buffer of
// `buffer_bytes` (writes larger than the buffer go straight through). flush() writes
// out the buffer; the destructor does NOT flush (a writer must call flush() or lose data,
// and errors are reported there).
class FileSink final : public ByteSink {
 public:
  FileSink(const UniqueFd& fd, std::uint64_t start_offset = 0, std::size_t buffer_bytes = 1 << 20);
  void write(ByteSpan data) override;
  using ByteSink::write;
  std::uint64_t position() const override { return written_ + buffer_.size(); }
  void flush();

 private:
  const UniqueFd& fd_;
  std::uint64_t start_;
  std::uint64_t written_ = 0;
  std::size_t capacity_;
  std::vector<std::byte> buffer_;
};

}  // namespace shardpoint
