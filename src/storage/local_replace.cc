#include "storage/local_replace.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/kill_point.h"
#include "core/unique_fd.h"
#include "shardpoint/error.h"

namespace shardpoint::storage {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& staged, const std::string& target, int err) {
  StorageError::Kind kind = StorageError::Kind::kOther;
  if (err == ENOENT) kind = StorageError::Kind::kNotFound;
  if (err == EACCES || err == EPERM) kind = StorageError::Kind::kPermission;
  if (err == ENOSPC) kind = StorageError::Kind::kNoSpace;
  throw StorageError(kind, what + " \"" + staged + "\" -> \"" + target + "\": " + std::strerror(err));
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_os_error("open folder", folder, errno);
  UniqueFd guard(fd, folder);
  if (::fsync(fd) != 0) throw_os_error("fsync folder", folder, errno);
}

}  // namespace

void replace_local_folder(const std::string& staged, const std::string& target, bool durable) {
  struct stat st {};
  const bool exists = ::lstat(target.c_str(), &st) == 0;
  kill_point(KillPoint::kPublish);
  if (!exists) {
    if (::rename(staged.c_str(), target.c_str()) != 0) fail("rename", staged, target, errno);
  } else if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    fail("exchange (renameat2 RENAME_EXCHANGE)", staged, target, errno);
  }
  if (durable) {
    std::filesystem::path parent = std::filesystem::path(target).parent_path();
    sync_folder(parent.empty() ? std::string(".") : parent.string());
  }
  if (exists) {
    kill_point(KillPoint::kRemoveOld);
    std::error_code ignored;  // best effort: the new folder is in place whatever happens here
    std::filesystem::remove_all(staged, ignored);
  }
}

}  // namespace shardpoint::storage
