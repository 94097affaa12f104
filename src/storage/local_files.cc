#include "storage/local_files.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "shardpoint/error.h"
#include "shardpoint/location.h"

namespace shardpoint::storage::local {

std::string describe_path(std::string_view path) { return "local file \"" + std::string(path) + "\""; }
std::string describe_dir(std::string_view path) { return "local directory \"" + std::string(path) + "\""; }

std::string parent_dir(const std::string& path) { return Location::parse(path).parent()->to_string(); }

std::string temp_path_for(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  return path + std::string(kTempMarker) + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
}

int open_raw(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd >= 0 ? fd : -errno;
}

UniqueFd open_or_throw(const std::string& path, int flags, const std::string& description) {
  int fd = open_raw(path, flags);
  if (fd < 0) throw_os_error("open", description, -fd);
  return UniqueFd(fd, description);
}

int pwrite_raw(int fd, const std::byte* data, std::size_t size, std::uint64_t offset) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

void publish_file(const std::string& tmp, const std::string& path, bool if_absent, const std::string& description) {
  if (!if_absent) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_os_error("rename", description, errno);
    return;
  }
  auto exists = [&] {
    throw StorageError(StorageError::Kind::kAlreadyExists, "publish " + description +
                                                               ": already exists (another writer published it first; " +
                                                               "create-only write refused)");
  };
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno == EEXIST) exists();
  if (errno != EINVAL && errno != ENOSYS) throw_os_error("rename", description, errno);
  // No RENAME_NOREPLACE here: link(2) fails with EEXIST just as atomically.
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    if (errno == EEXIST) exists();
    throw_os_error("link", description, errno);
  }
  ::unlink(tmp.c_str());
}

void make_dirs(const std::string& dir, bool durable) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return;
    throw StorageError(StorageError::Kind::kOther, "mkdir " + describe_dir(dir) + ": exists and is not a directory");
  }
  if (errno != ENOENT) throw_os_error("stat", describe_dir(dir), errno);
  const std::string parent = parent_dir(dir);
  make_dirs(parent, durable);
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return;  // another thread made it
    throw_os_error("mkdir", describe_dir(dir), errno);
  }
  if (durable) fsync_directory(parent);
}

}  // namespace shardpoint::storage::local
