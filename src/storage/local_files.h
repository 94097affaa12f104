// Shared parts of the "file" driver (storage/local_storage.h): the state of one opened root,
// which LocalStorage and its writers share, and the path and file helpers both use.
// Internal to src/storage.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/buffer_pool.h"
#include "core/unique_fd.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::storage::local {

// O_DIRECT alignment of file offsets, lengths and buffer addresses. 4096 covers every
// logical block size we meet; the pool's buffers are aligned to it.
inline constexpr std::uint64_t kDirectAlign = 4096;

// One opened root directory. Thread-safe (the atomics; the rest is set before sharing).
struct LocalRoot {
  std::string root;  // absolute, normalized, no trailing '/' (unless "/")
  StorageOptions options;
  std::shared_ptr<BufferPool> pool;
  // Set once a filesystem under root refused O_DIRECT; later writers go buffered.
  std::atomic<bool> direct_refused{false};
  std::atomic<std::size_t> mmaps{0};

  std::string path_of(std::string_view key) const {
    return root == "/" ? "/" + std::string(key) : root + "/" + std::string(key);
  }
};

// "local file \"PATH\"" and "local directory \"PATH\"", for messages.
std::string describe_path(std::string_view path);
std::string describe_dir(std::string_view path);

// The directory holding `path`. REQUIRES path is absolute and not "/" (every path here is
// the root joined with a key).
std::string parent_dir(const std::string& path);

// A fresh temporary name beside `path` ("<path><kTempMarker><pid>.<n>"), unique in the
// process, so two LocalStorage objects on one directory never pick the same name.
std::string temp_path_for(const std::string& path);

// open() with O_CLOEXEC and EINTR retry; returns the fd or -errno.
int open_raw(const std::string& path, int flags, mode_t mode = 0644);

// open_raw, or throws the StorageError of the failure (named by `description`).
UniqueFd open_or_throw(const std::string& path, int flags, const std::string& description);

// pwrite of all of data; returns 0 or the errno of the failing call.
int pwrite_raw(int fd, const std::byte* data, std::size_t size, std::uint64_t offset);

// mkdir -p. Each directory created is made durable by an fsync of its parent when asked,
// so a committed file is never left in a directory entry that a crash forgets. Throws
// StorageError.
void make_dirs(const std::string& dir, bool durable);

// Publishes the file tmp under path: rename(2), replacing any file there; with if_absent
// only when there is none (renameat2 RENAME_NOREPLACE, or link(2) + unlink(2) where the
// filesystem refuses that flag), else StorageError kAlreadyExists naming description and
// tmp stays (the caller removes it). Throws StorageError for other failures.
void publish_file(const std::string& tmp, const std::string& path, bool if_absent, const std::string& description);

}  // namespace shardpoint::storage::local
