#include "storage/memory_storage.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"

namespace shardpoint::storage {
namespace {

using Blob = std::shared_ptr<const std::string>;

// One namespace: key -> immutable bytes.
struct Namespace {
  Mutex mu;
  std::map<std::string, Blob, std::less<>> objects SP_GUARDED_BY(mu);
};

struct NamedNamespaces {
  Mutex mu;
  std::map<std::string, std::shared_ptr<Namespace>, std::less<>> by_name SP_GUARDED_BY(mu);
};

NamedNamespaces& named() {
  static NamedNamespaces n;
  return n;
}

constexpr std::string_view kScheme = "memory://";

// Owns the blob it reads from, so it outlives the storage and later replacements.
class BlobSource final : public ByteSource {
 public:
  BlobSource(Blob blob, std::string name) : blob_(std::move(blob)), source_(as_bytes(*blob_), std::move(name)) {}
  const std::string& name() const override { return source_.name(); }
  std::uint64_t size() const override { return source_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    source_.read(offset, out, what);
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    return source_.view(offset, length, what);
  }

 private:
  Blob blob_;
  MemorySource source_;
};

class MemoryWriter;

class MemoryStorage final : public Storage {
 public:
  MemoryStorage(std::string name, std::shared_ptr<Namespace> ns) : name_(std::move(name)), ns_(std::move(ns)) {}

  StorageFeatures features() const override {
    StorageFeatures f;
    f.range_reads = true;
    f.atomic_publish = true;
    f.parallel_writes = true;
    f.conditional_put = true;
    return f;
  }
  std::string url() const override { return std::string(kScheme) + name_; }
  std::string describe_key(std::string_view key) const override {
    return "memory object \"" + url() + "/" + std::string(key) + "\"";
  }

  Blob get(std::string_view key, const IoOptions& io, std::string_view op) const {
    validate_key(key);
    if (io_expired(io)) check_io(io, op);
    MutexLock lock(ns_->mu);
    auto it = ns_->objects.find(key);
    if (it == ns_->objects.end()) {
      throw StorageError(StorageError::Kind::kNotFound, std::string(op) + " " + describe_key(key) + ": no such object");
    }
    return it->second;
  }

  std::uint64_t stat(std::string_view key, const IoOptions& io) override { return get(key, io, "stat")->size(); }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io) override {
    Blob blob = get(key, io, "read");
    MemorySource(as_bytes(*blob), describe_key(key)).read(offset, out, "read");
  }

  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options,
                                          const IoOptions& io) override {
    Blob blob = get(key, io, "open");
    return std::make_unique<BlobSource>(std::move(blob), describe_key(key));
  }

  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options,
                                             const IoOptions& io) override;

  // Replaces the object, or (if_absent) adds it only when there is none.
  void publish(std::string_view key, std::string bytes, bool if_absent) {
    auto blob = std::make_shared<const std::string>(std::move(bytes));
    MutexLock lock(ns_->mu);
    if (if_absent && ns_->objects.contains(key)) {
      throw StorageError(StorageError::Kind::kAlreadyExists,
                         "publish " + describe_key(key) + ": already exists (create-only write refused)");
    }
    ns_->objects.insert_or_assign(std::string(key), std::move(blob));
  }

  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "write");
    publish(key, std::string(as_chars(data)), options.if_absent);
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    if (io_expired(io)) check_io(io, "list " + url());
    std::vector<ObjectInfo> out;
    MutexLock lock(ns_->mu);
    for (auto it = ns_->objects.lower_bound(prefix); it != ns_->objects.end() && it->first.starts_with(prefix); ++it) {
      out.push_back({it->first, it->second->size()});
    }
    return out;
  }

  void remove(std::string_view key, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "remove " + describe_key(key));
    MutexLock lock(ns_->mu);
    auto it = ns_->objects.find(key);
    if (it != ns_->objects.end()) ns_->objects.erase(it);
  }

  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    if (io_expired(io)) check_io(io, "remove " + url());
    MutexLock lock(ns_->mu);
    auto first = ns_->objects.lower_bound(prefix);
    auto last = first;
    std::size_t n = 0;
    while (last != ns_->objects.end() && last->first.starts_with(prefix)) {
      ++last;
      ++n;
    }
    ns_->objects.erase(first, last);
    return n;
  }

 private:
  std::string name_;
  std::shared_ptr<Namespace> ns_;
};

// Stages bytes in a string; commit() publishes them. Keeps the storage's namespace alive
// through a copy of the MemoryStorage's state (name + namespace).
class MemoryWriter final : public StorageWriter {
 public:
  MemoryWriter(std::unique_ptr<MemoryStorage> target, std::string key, bool if_absent)
      : target_(std::move(target)), key_(std::move(key)), if_absent_(if_absent) {}

  void append(ByteSpan data, const IoOptions& io) override {
    if (io_expired(io)) check_io(io, "write " + target_->describe_key(key_));
    MutexLock lock(mu_);
    check_open("append");
    if (random_) throw UsageError("append " + target_->describe_key(key_) + ": writer already used with write_at()");
    appending_ = true;
    bytes_.append(as_chars(data));
  }

  void write_at(std::uint64_t offset, ByteSpan data, const IoOptions& io) override {
    if (io_expired(io)) check_io(io, "write " + target_->describe_key(key_));
    MutexLock lock(mu_);
    check_open("write_at");
    if (appending_) throw UsageError("write_at " + target_->describe_key(key_) + ": writer already used with append()");
    random_ = true;
    std::uint64_t end = offset + data.size();
    if (end > bytes_.size()) bytes_.resize(end, '\0');
    if (!data.empty()) std::memcpy(bytes_.data() + offset, data.data(), data.size());
  }

  std::uint64_t position() const override {
    MutexLock lock(mu_);
    return appending_ ? bytes_.size() : 0;
  }

  void commit(const IoOptions& io) override {
    if (io_expired(io)) check_io(io, "commit " + target_->describe_key(key_));
    MutexLock lock(mu_);
    check_open("commit");
    committed_ = true;
    target_->publish(key_, std::move(bytes_), if_absent_);
  }

  const std::string& key() const override { return key_; }

 private:
  void check_open(std::string_view op) const SP_REQUIRES(mu_) {
    if (committed_) {
      throw UsageError(std::string(op) + " " + target_->describe_key(key_) + ": writer already committed");
    }
  }

  std::unique_ptr<MemoryStorage> target_;
  std::string key_;
  bool if_absent_ = false;  // WriteOptions::if_absent
  mutable Mutex mu_;
  std::string bytes_ SP_GUARDED_BY(mu_);
  bool appending_ SP_GUARDED_BY(mu_) = false;
  bool random_ SP_GUARDED_BY(mu_) = false;
  bool committed_ SP_GUARDED_BY(mu_) = false;
};

std::unique_ptr<StorageWriter> MemoryStorage::open_writer(std::string_view key, const WriteOptions& options,
                                                          const IoOptions& io) {
  validate_key(key);
  if (io_expired(io)) check_io(io, "open " + describe_key(key));
  return std::make_unique<MemoryWriter>(std::make_unique<MemoryStorage>(name_, ns_), std::string(key),
                                        options.if_absent);
}

}  // namespace

std::unique_ptr<Storage> open_memory_storage(const Location& location, const StorageOptions& options) {
  if (location.scheme() != Scheme::kMemory) {
    throw UsageError("storage URL \"" + location.text() + "\": expected memory://name");
  }
  // The namespace is the authority and path: "memory://n/k" is namespace "n/k".
  const std::string name = location.to_string().substr(kScheme.size());
  if (!location.query().empty() || name.find('#') != std::string::npos) {
    throw UsageError("storage URL \"" + location.text() + "\": memory URLs take no query or fragment");
  }
  if (name.empty()) return std::make_unique<MemoryStorage>("", std::make_shared<Namespace>());
  NamedNamespaces& n = named();
  MutexLock lock(n.mu);
  auto it = n.by_name.find(name);
  if (it == n.by_name.end()) it = n.by_name.emplace(std::string(name), std::make_shared<Namespace>()).first;
  return std::make_unique<MemoryStorage>(std::string(name), it->second);
}

void drop_memory_storage(std::string_view name) {
  NamedNamespaces& n = named();
  MutexLock lock(n.mu);
  auto it = n.by_name.find(name);
  if (it != n.by_name.end()) n.by_name.erase(it);
}

namespace {
const StorageRegistration kMemoryRegistration{"memory", &open_memory_storage};
}  // namespace

}  // namespace shardpoint::storage
