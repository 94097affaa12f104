// RAII ownership of a POSIX file descriptor, and the EINTR/short-I/O-safe calls on it.
//
// Every function that fails throws StorageError through throw_os_error(), naming the
// path the descriptor was opened with. A UniqueFd is move-only; it is not thread-safe
// to move or close concurrently, but pread/pwrite on one descriptor from several threads
// is fine (positional I/O).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/byte_io.h"

namespace shardpoint {

class UniqueFd {
 public:
  UniqueFd() = default;
  UniqueFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // Opens path with O_CLOEXEC added to flags. Throws StorageError on failure.
  static UniqueFd open(const std::string& path, int flags, mode_t mode = 0644);

  int get() const { return fd_; }
  const std::string& path() const { return path_; }
  bool valid() const { return fd_ >= 0; }

  // Closes now and reports a failed close (which can carry a delayed write error).
  void close();
  // Closes, ignoring errors (destructor path).
  void reset() noexcept;

  std::uint64_t size() const;

  // Reads exactly out.size() bytes at offset; a short file is a FormatError naming
  // `what`, the offset and the bytes missing.
  void pread_exact(std::span<std::byte> out, std::uint64_t offset, std::string_view what) const;
  // Reads up to out.size() bytes; returns the count (less only at end of file).
  std::size_t pread_some(std::span<std::byte> out, std::uint64_t offset) const;
  // Writes all of data at offset.
  void pwrite_all(ByteSpan data, std::uint64_t offset) const;
  void fsync() const;

 private:
  int fd_ = -1;
  std::string path_;
};

// fsync of a directory, so a rename or create inside it is durable.
void fsync_directory(const std::string& dir);

// Reads a whole (small) file into a string. Throws StorageError.
std::string read_file(const std::string& path);

}  // namespace shardpoint
