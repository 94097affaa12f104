#include "core/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace shardpoint {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

UniqueFd UniqueFd::open(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_os_error("open", path, errno);
  return UniqueFd(fd, path);
}

void UniqueFd::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) throw_os_error("close", path_, errno);
}

void UniqueFd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::uint64_t UniqueFd::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_os_error("stat", path_, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

std::size_t UniqueFd::pread_some(std::span<std::byte> out, std::uint64_t offset) const {
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("read", path_, errno);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void UniqueFd::pread_exact(std::span<std::byte> out, std::uint64_t offset, std::string_view what) const {
  std::size_t got = pread_some(out, offset);
  if (got != out.size()) {
    throw FormatError(path_ + ": " + std::string(what) + " at offset " + std::to_string(offset) + ": needs " +
                      std::to_string(out.size()) + " bytes, file ends after " + std::to_string(got));
  }
}

void UniqueFd::pwrite_all(ByteSpan data, std::uint64_t offset) const {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("write", path_, errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

void UniqueFd::fsync() const {
  if (::fsync(fd_) != 0) throw_os_error("fsync", path_, errno);
}

void fsync_directory(const std::string& dir) {
  UniqueFd fd = UniqueFd::open(dir, O_RDONLY | O_DIRECTORY);
  fd.fsync();
}

std::string read_file(const std::string& path) {
  UniqueFd fd = UniqueFd::open(path, O_RDONLY);
  std::string out(fd.size(), '\0');
  std::size_t got = fd.pread_some(std::as_writable_bytes(std::span(out)), 0);
  out.resize(got);
  return out;
}

}  // namespace shardpoint
