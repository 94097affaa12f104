// The byte sources and sinks that need the operating system: FileSource (pread window),
// MappedSource (window of a mapping) and FileSink (buffered pwrite). The interfaces
// ByteSource / ByteSink and the in-memory MemorySource / StringSink are public
// (shardpoint/byte_stream.h).
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
#include "shardpoint/byte_stream.h"

namespace shardpoint {

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
  MappedSource(std::shared_ptr<const MappedRegion> region, std::uint64_t base, std::uint64_t length, std::string name)
      : region_(std::move(region)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override;
  std::unique_ptr<MappedSource> window(std::uint64_t offset, std::uint64_t length, std::string name) const;
  const std::shared_ptr<const MappedRegion>& region() const { return region_; }
  std::uint64_t base() const { return base_; }

 private:
  std::shared_ptr<const MappedRegion> region_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
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
