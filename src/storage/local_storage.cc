#include "storage/local_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "core/buffer_pool.h"
#include "core/byte_stream.h"
#include "core/mapped_region.h"
#include "core/unique_fd.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "storage/local_files.h"
#include "storage/local_writer.h"

namespace shardpoint::storage {
namespace {

using local::describe_dir;
using local::describe_path;
using local::kDirectAlign;
using local::LocalRoot;
using local::make_dirs;
using local::open_local_writer;
using local::open_or_throw;
using local::open_raw;
using local::parent_dir;
using local::pwrite_raw;
using local::temp_path_for;

using DirPtr = std::unique_ptr<DIR, int (*)(DIR*)>;

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(std::shared_ptr<LocalRoot> shared) : shared_(std::move(shared)) {}

  StorageFeatures features() const override {
    StorageFeatures f;
    f.range_reads = true;
    f.atomic_publish = true;
    f.direct_io = shared_->options.direct_io;
    f.local_path = true;
    f.parallel_writes = true;
    f.conditional_put = true;
    return f;
  }

  std::string url() const override { return "file://" + shared_->root; }

  std::string describe_key(std::string_view key) const override { return describe_path(shared_->path_of(key)); }

  std::optional<std::string> local_path(std::string_view key) const override {
    validate_key(key);
    return shared_->path_of(key);
  }

  std::uint64_t stat(std::string_view key, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "stat " + describe_key(key));
    std::string path = shared_->path_of(key);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      throw_os_error("stat", describe_path(path), errno == ENOTDIR ? ENOENT : errno);
    }
    if (!S_ISREG(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound, "stat " + describe_path(path) + ": not a regular file");
    }
    return static_cast<std::uint64_t>(st.st_size);
  }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "read " + describe_key(key));
    UniqueFd fd = open_read(key);
    fd.pread_exact(out, offset, "read");
  }

  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options,
                                          const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "open " + describe_key(key));
    UniqueFd fd = open_read(key);
    std::string description = fd.path();
    std::uint64_t size = fd.size();
    // Map unless the mapping limit is reached (then pread, as LevelDB's mmap limiter).
    if (options.prefer_mmap && size > 0) {
      if (shared_->mmaps.fetch_add(1) < shared_->options.max_mmaps) {
        try {
          auto region =
              std::shared_ptr<const MappedRegion>(new MappedRegion(MappedRegion::map_file(shared_->path_of(key))),
                                                  [shared = shared_](const MappedRegion* r) {
                                                    delete r;
                                                    shared->mmaps.fetch_sub(1);
                                                  });
          std::uint64_t mapped = region->size();
          return std::make_unique<MappedSource>(std::move(region), 0, mapped, description);
        } catch (...) {
          shared_->mmaps.fetch_sub(1);
          throw;
        }
      }
      shared_->mmaps.fetch_sub(1);
    }
    return std::make_unique<FileSource>(std::make_shared<const UniqueFd>(std::move(fd)), 0, size, description);
  }

  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options,
                                             const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "open " + describe_key(key));
    return open_local_writer(shared_, std::string(key), options);
  }

  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "write " + describe_key(key));
    const std::string path = shared_->path_of(key);
    const std::string description = describe_path(path);
    make_dirs(parent_dir(path), options.durable);
    // 1. Write a temporary file next to the target (same filesystem, so rename is atomic).
    const std::string tmp = temp_path_for(path);
    UniqueFd fd = open_or_throw(tmp, O_WRONLY | O_CREAT | O_EXCL, description);
    bool renamed = false;
    try {
      if (int err = pwrite_raw(fd.get(), data.data(), data.size(), 0); err != 0) {
        throw_os_error("write", description, err);
      }
      // 2. fsync it, so the name never points at data that is not on disk.
      if (options.durable) fd.fsync();
      fd.close();
      // 3. rename over the target: readers see the old file or the new one (create-only
      //    with if_absent: the rename fails when a file is there).
      local::publish_file(tmp, path, options.if_absent, description);
      renamed = true;
      // 4. fsync the directory, so the rename itself survives a crash.
      if (options.durable) fsync_directory(parent_dir(path));
    } catch (...) {
      if (!renamed) ::unlink(tmp.c_str());
      throw;
    }
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::vector<ObjectInfo> out;
    walk(prefix, io, [&](const std::string& key, const struct stat& st, bool is_temp) {
      if (!is_temp && key.starts_with(prefix)) out.push_back({key, static_cast<std::uint64_t>(st.st_size)});
    });
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  void remove(std::string_view key, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "remove " + describe_key(key));
    std::string path = shared_->path_of(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR && errno != EISDIR) {
      throw_os_error("remove", describe_path(path), errno);
    }
  }

  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::size_t removed = 0;
    std::vector<std::pair<std::string, bool>> victims;  // (key, is_temp)
    walk(prefix, io, [&](const std::string& key, const struct stat&, bool is_temp) {
      // A temporary file belongs to the key before its marker.
      std::string_view owner = std::string_view(key).substr(0, key.find(kTempMarker));
      if (owner.starts_with(prefix)) victims.emplace_back(key, is_temp);
    });
    for (const auto& [key, is_temp] : victims) {
      std::string path = shared_->path_of(key);
      if (::unlink(path.c_str()) != 0) {
        if (errno == ENOENT) continue;
        throw_os_error("remove", describe_path(path), errno);
      }
      if (!is_temp) ++removed;
    }
    prune_empty_dirs(prefix);
    return removed;
  }

 private:
  UniqueFd open_read(std::string_view key) const {
    std::string path = shared_->path_of(key);
    std::string description = describe_path(path);
    int fd = open_raw(path, O_RDONLY);
    if (fd < 0) throw_os_error("open", description, -fd == ENOTDIR ? ENOENT : -fd);
    UniqueFd ufd(fd, description);
    struct stat st;
    if (::fstat(fd, &st) != 0) throw_os_error("stat", description, errno);
    if (!S_ISREG(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound, "open " + description + ": not a regular file");
    }
    return ufd;
  }

  // Calls fn(key, stat, is_temp) for every regular file under the directory part of prefix
  // whose key could start with prefix. A missing directory yields nothing.
  template <typename Fn>
  void walk(std::string_view prefix, const IoOptions& io, Fn&& fn) {
    std::size_t slash = prefix.rfind('/');
    std::string dir_key = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash + 1));
    walk_dir(dir_key, prefix, io, fn);
  }

  template <typename Fn>
  void walk_dir(const std::string& dir_key, std::string_view prefix, const IoOptions& io, Fn& fn) {
    std::string dir = dir_key.empty() ? shared_->root : shared_->path_of(dir_key.substr(0, dir_key.size() - 1));
    if (io_expired(io)) check_io(io, "list " + describe_dir(dir));
    DirPtr d(::opendir(dir.c_str()), &::closedir);
    if (!d) {
      if (errno == ENOENT || errno == ENOTDIR) return;
      throw_os_error("list", describe_dir(dir), errno);
    }
    std::vector<std::string> subdirs;
    while (true) {
      errno = 0;
      struct dirent* e = ::readdir(d.get());
      if (e == nullptr) {
        if (errno != 0) throw_os_error("list", describe_dir(dir), errno);
        break;
      }
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string key = dir_key + std::string(name);
      struct stat st;
      if (::fstatat(::dirfd(d.get()), e->d_name, &st, 0) != 0) {
        if (errno == ENOENT) continue;  // removed while we listed
        throw_os_error("stat", describe_path(shared_->path_of(key)), errno);
      }
      if (S_ISDIR(st.st_mode)) {
        std::string sub = key + "/";
        if (sub.starts_with(prefix) || prefix.starts_with(sub)) subdirs.push_back(std::move(sub));
      } else if (S_ISREG(st.st_mode)) {
        fn(key, st, name.find(kTempMarker) != std::string_view::npos);
      }
    }
    d.reset();
    for (const std::string& sub : subdirs) walk_dir(sub, prefix, io, fn);
  }

  // Removes directories under prefix left empty, deepest first; never the root.
  void prune_empty_dirs(std::string_view prefix) {
    std::size_t slash = prefix.rfind('/');
    std::string dir_key = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash + 1));
    prune_dir(dir_key, prefix);
    // The prefix "a/" names the directory "a" itself: it goes too when empty.
    if (!dir_key.empty() && dir_key == prefix) ::rmdir(shared_->path_of(dir_key.substr(0, dir_key.size() - 1)).c_str());
  }

  void prune_dir(const std::string& dir_key, std::string_view prefix) {
    std::string dir = dir_key.empty() ? shared_->root : shared_->path_of(dir_key.substr(0, dir_key.size() - 1));
    std::vector<std::string> subdirs;
    {
      DirPtr d(::opendir(dir.c_str()), &::closedir);
      if (!d) return;
      while (struct dirent* e = ::readdir(d.get())) {
        std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        std::string sub = dir_key + std::string(name) + "/";
        struct stat st;
        if (::fstatat(::dirfd(d.get()), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
            (sub.starts_with(prefix) || prefix.starts_with(sub))) {
          subdirs.push_back(std::move(sub));
        }
      }
    }
    for (const std::string& sub : subdirs) {
      prune_dir(sub, prefix);
      // Only directories wholly inside the prefix go; ENOTEMPTY means something else lives there.
      if (sub.starts_with(prefix)) ::rmdir(shared_->path_of(sub.substr(0, sub.size() - 1)).c_str());
    }
  }

  std::shared_ptr<LocalRoot> shared_;
};

}  // namespace

std::unique_ptr<Storage> open_local_storage_at(const std::string& root, const StorageOptions& options) {
  if (root.empty()) throw UsageError("local storage: empty directory path");
  auto shared = std::make_shared<LocalRoot>();
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(root, ec);
  if (ec) throw UsageError("local storage \"" + root + "\": " + ec.message());
  std::string normalized = abs.lexically_normal().string();
  while (normalized.size() > 1 && normalized.back() == '/') normalized.pop_back();
  shared->root = normalized;
  shared->options = options;
  shared->pool = options.buffer_pool;
  if (!shared->pool) {
    BufferPoolOptions pool_options;
    // 4 MiB O_DIRECT writes reach the disk ceiling (fio reaches it with 1 MiB), and a writer
    // touches only two buffers (filling + being written).
    pool_options.buffer_bytes = std::size_t{4} << 20;
    pool_options.capacity_bytes = options.default_pool_bytes;
    shared->pool = std::make_shared<BufferPool>(pool_options);
  }
  if (shared->pool->alignment() % kDirectAlign != 0) {
    throw UsageError("local storage: buffer pool alignment " + std::to_string(shared->pool->alignment()) +
                     " is not a multiple of " + std::to_string(kDirectAlign) + " (needed for O_DIRECT)");
  }
  return std::make_unique<LocalStorage>(std::move(shared));
}

std::unique_ptr<Storage> open_local_storage(const Location& location, const StorageOptions& options) {
  if (location.is_remote()) {
    throw UsageError("storage URL \"" + location.text() + "\": not a local path or file:// URL");
  }
  return open_local_storage_at(location.path(), options);
}

namespace {
const StorageRegistration kFileRegistration{"file", &open_local_storage};
}  // namespace

}  // namespace shardpoint::storage
