#include "core/byte_stream.h"

#include <fcntl.h>

#include <cstring>

namespace shardpoint {

void ByteSource::check_range(std::uint64_t offset, std::uint64_t length, std::string_view what) const {
  if (offset > size() || length > size() - offset) {
    throw FormatError(name() + ": " + std::string(what) + " at offset " + std::to_string(offset) + ": needs " +
                      std::to_string(length) + " bytes, " + std::to_string(offset > size() ? 0 : size() - offset) +
                      " left");
  }
}

std::string ByteSource::read_string(std::uint64_t offset, std::uint64_t length, std::string_view what) const {
  check_range(offset, length, what);
  std::string out(static_cast<std::size_t>(length), '\0');
  read(offset, std::as_writable_bytes(std::span(out)), what);
  return out;
}

void MemorySource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  check_range(offset, out.size(), what);
  if (!out.empty()) std::memcpy(out.data(), data_.data() + offset, out.size());
}

std::optional<ByteSpan> MemorySource::view(std::uint64_t offset, std::uint64_t length, std::string_view what) const {
  check_range(offset, length, what);
  return data_.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
}

std::unique_ptr<FileSource> FileSource::open(const std::string& path) {
  auto fd = std::make_shared<const UniqueFd>(UniqueFd::open(path, O_RDONLY));
  std::uint64_t size = fd->size();
  return std::make_unique<FileSource>(std::move(fd), 0, size, path);
}

void FileSource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  check_range(offset, out.size(), what);
  fd_->pread_exact(out, base_ + offset, what);
}

void FileSource::will_need(std::uint64_t offset, std::uint64_t length) const {
  if (offset >= length_) return;
  length = std::min(length, length_ - offset);
  ::posix_fadvise(fd_->get(), static_cast<off_t>(base_ + offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
}

std::unique_ptr<FileSource> FileSource::window(std::uint64_t offset, std::uint64_t length, std::string name) const {
  check_range(offset, length, "window");
  return std::make_unique<FileSource>(fd_, base_ + offset, length, std::move(name));
}

std::unique_ptr<MappedSource> MappedSource::open(const std::string& path) {
  auto region = std::make_shared<const MappedRegion>(MappedRegion::map_file(path));
  std::uint64_t size = region->size();
  return std::make_unique<MappedSource>(std::move(region), 0, size, path);
}

void MappedSource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  check_range(offset, out.size(), what);
  if (!out.empty()) std::memcpy(out.data(), region_->bytes().data() + base_ + offset, out.size());
}

std::optional<ByteSpan> MappedSource::view(std::uint64_t offset, std::uint64_t length, std::string_view what) const {
  check_range(offset, length, what);
  return region_->bytes().subspan(static_cast<std::size_t>(base_ + offset), static_cast<std::size_t>(length));
}

std::unique_ptr<MappedSource> MappedSource::window(std::uint64_t offset, std::uint64_t length, std::string name) const {
  check_range(offset, length, "window");
  return std::make_unique<MappedSource>(region_, base_ + offset, length, std::move(name));
}

FileSink::FileSink(const UniqueFd& fd, std::uint64_t start_offset, std::size_t buffer_bytes)
    : fd_(fd), start_(start_offset), capacity_(buffer_bytes) {
  buffer_.reserve(capacity_);
}

void FileSink::write(ByteSpan data) {
  if (buffer_.size() + data.size() > capacity_) flush();
  if (data.size() >= capacity_) {
    fd_.pwrite_all(data, start_ + written_);
    written_ += data.size();
    return;
  }
  buffer_.insert(buffer_.end(), data.begin(), data.end());
}

void FileSink::flush() {
  if (buffer_.empty()) return;
  fd_.pwrite_all(buffer_, start_ + written_);
  written_ += buffer_.size();
  buffer_.clear();
}

}  // namespace shardpoint
