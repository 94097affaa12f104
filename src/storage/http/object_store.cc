#include "storage/http/object_store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "shardpoint/error.h"
#include "storage/http/ranged_reads.h"

namespace shardpoint::storage::http {
namespace {

// The least a first GET asks for: a round trip fetches 64 KiB about as fast as a byte, and the
// small items a reader asked for may sit a few records further.
constexpr std::size_t kMinFirstGetBytes = std::size_t{64} << 10;

class ObjectStoreStorage final : public Storage {
 public:
  ObjectStoreStorage(std::shared_ptr<ObjectClient> client, std::string query)
      : client_(std::move(client)), query_(std::move(query)) {
    const SourceLimits limits = client_->source_limits();
    read_budget_ = std::make_shared<ReadAheadBudget>(WindowedSource::cache_bytes(limits.window_bytes, limits.windows));
  }

  StorageFeatures features() const override {
    StorageFeatures f;
    f.range_reads = true;
    f.atomic_publish = true;
    f.conditional_put = true;
    f.object_store = true;
    return f;
  }

  std::string url() const override { return client_->root_url() + (query_.empty() ? "" : "?" + query_); }
  std::string describe_key(std::string_view key) const override { return client_->describe(key); }

  std::uint64_t stat(std::string_view key, const IoOptions& io) override {
    start("stat", key, io);
    return existing(key, io, "stat").size;
  }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io) override {
    start("read", key, io);
    if (out.empty()) {
      std::uint64_t size = existing(key, io, "read").size;
      if (offset > size) {
        throw FormatError("read " + client_->describe(key) + ": offset " + std::to_string(offset) +
                          " is past the end of the object (" + std::to_string(size) + " bytes)");
      }
      return;
    }
    client_->read_into(key, offset, out, io, "read", "");
  }

  // When the caller reads only the object's first bytes first (first_read_bytes up to
  // whole_bytes: another rank's small items), read_first() brings those (at least
  // kMinFirstGetBytes) with the request that opens the object (S3, Azure: no HEAD): an object
  // they cover is read whole, a larger one through read-ahead windows that keep them as their
  // first block. Otherwise a HEAD opens it, and an object up to whole_bytes is read whole, a
  // larger one through windows: a caller that streams the object reads it in window-sized
  // GETs (fetched ahead, in parallel), which a first GET would delay.
  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options,
                                          const IoOptions& io) override {
    start("open", key, io);
    const SourceLimits limits = client_->source_limits();
    const std::size_t whole_bytes = std::max<std::size_t>(limits.whole_bytes, 1);
    const bool first_bytes_only = options.first_read_bytes > 0 && options.first_read_bytes <= whole_bytes;
    const std::size_t first_get =
        std::min(whole_bytes, std::max(static_cast<std::size_t>(options.first_read_bytes), kMinFirstGetBytes));
    // A HEAD reads an object up to whole_bytes whole; a first GET leaves the rest of any object
    // to the windows (the caller said it needs the first bytes first).
    ObjectClient::FirstBytes found = first_bytes_only ? open_first(key, true, first_get, 0, io, "open")
                                                      : open_first(key, false, whole_bytes, whole_bytes, io, "open");
    const ObjectClient::Version& version = found.version;
    if (found.length < version.size) {
      auto source = windowed_source(key, version, limits);
      source->adopt_first_block(std::move(found.bytes), found.length);
      return source;
    }
    return std::make_unique<WholeObjectSource>(bytes_of(found), client_->describe(key));
  }

  // One request for an object up to whole_bytes (read_first()), else that and the rest.
  std::optional<std::string> try_read_all(std::string_view key, const IoOptions& io) override {
    start("read", key, io);
    const std::size_t whole_bytes = std::max<std::size_t>(client_->source_limits().whole_bytes, 1);
    ObjectClient::FirstBytes found;
    try {
      found = open_first(key, /*first_bytes_only=*/true, whole_bytes,
                         /*complete_up_to=*/std::numeric_limits<std::uint64_t>::max(), io, "read");
    } catch (const StorageError& e) {
      if (e.kind() == StorageError::Kind::kNotFound) return std::nullopt;
      throw;
    }
    return bytes_of(found);
  }

  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options,
                                             const IoOptions& io) override {
    start("open", key, io);
    return client_->open_writer(std::string(key), options);
  }

  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options, const IoOptions& io) override {
    start("write", key, io);
    try {
      client_->put(key, data, io, "write", options);  // one request publishes the whole object
    } catch (const StorageError& e) {
      if (e.kind() != StorageError::Kind::kAlreadyExists || !holds_exactly(key, data, io)) throw;
      // Ours: an attempt whose answer was lost published it, and its retry found it.
    }
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::string what = "list " + client_->root_url() + "/" + std::string(prefix);
    if (io_expired(io)) check_io(io, what);
    std::vector<ObjectInfo> out = client_->list(prefix, io, what);
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  void remove(std::string_view key, const IoOptions& io) override {
    start("remove", key, io);
    client_->remove(key, io, "remove " + client_->describe(key));
  }

  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::vector<ObjectInfo> objects = list(prefix, io);
    for_each_in_parallel(objects.size(), 8, [&](std::size_t i) { remove(objects[i].key, io); });
    client_->remove_leftovers(prefix, io);
    return objects.size();
  }

 private:
  void start(std::string_view op, std::string_view key, const IoOptions& io) const {
    validate_key(key);
    if (io_expired(io)) check_io(io, std::string(op) + " " + client_->describe(key));
  }

  // Opens key with its first max_bytes (ObjectClient::read_first() when first_bytes_only, else
  // open_with_head()), then reads the rest of an object of at most complete_up_to bytes
  // (pinned to its version); looks again when it was replaced between two of these requests
  // (bounded). Throws StorageError kNotFound "<op> <object>: no such object".
  ObjectClient::FirstBytes open_first(std::string_view key, bool first_bytes_only, std::size_t max_bytes,
                                      std::uint64_t complete_up_to, const IoOptions& io, const std::string& op) {
    for (int tries = 0;; ++tries) {
      std::optional<ObjectClient::FirstBytes> found;
      try {
        found = first_bytes_only ? client_->read_first(key, max_bytes, io, op)
                                 : client_->open_with_head(key, max_bytes, io, op);
        const std::uint64_t size = found ? found->version.size : 0;
        if (found && found->length < size && size <= complete_up_to) {
          std::shared_ptr<std::byte[]> all = std::make_shared_for_overwrite<std::byte[]>(size);
          if (found->length > 0) std::memcpy(all.get(), found->bytes.get(), found->length);
          client_->read_into(key, found->length, std::span(all.get() + found->length, size - found->length), io, op,
                             found->version.tag);
          found->bytes = std::move(all);
          found->length = static_cast<std::size_t>(size);
        }
      } catch (const StorageError& e) {
        if (tries < 3 && !e.retryable() && e.kind() != StorageError::Kind::kPermission) continue;
        throw;
      } catch (const FormatError&) {  // shorter now than the HEAD said
        if (tries < 3) continue;
        throw;
      }
      if (!found)
        throw StorageError(StorageError::Kind::kNotFound, op + " " + client_->describe(key) + ": no such object");
      return std::move(*found);
    }
  }

  // The bytes found, as a string.
  static std::string bytes_of(const ObjectClient::FirstBytes& found) {
    std::string bytes(found.length, '\0');
    if (found.length > 0) std::memcpy(bytes.data(), found.bytes.get(), found.length);
    return bytes;
  }

  // A large object read lazily through read-ahead windows, every GET pinned to version.
  std::unique_ptr<WindowedSource> windowed_source(std::string_view key, const ObjectClient::Version& version,
                                                  const SourceLimits& limits) const {
    // The source outlives this Storage (storage.h): the fetch keeps the client alive.
    auto fetch = [client = client_, name = std::string(key), tag = version.tag](std::uint64_t offset,
                                                                                std::span<std::byte> out) {
      client->read_into(name, offset, out, {}, "read", tag);
    };
    return std::make_unique<WindowedSource>(client_->describe(key), version.size, limits.window_bytes, limits.windows,
                                            std::move(fetch), limits.windows_ahead, read_budget_);
  }

  // True when the object under key is exactly data (compared in full; small objects only
  // reach here: `.metadata`).
  bool holds_exactly(std::string_view key, ByteSpan data, const IoOptions& io) {
    std::optional<ObjectClient::Version> version = client_->head(key, io, "check");
    if (!version || version->size != data.size()) return false;
    std::string bytes(data.size(), '\0');
    try {
      if (!bytes.empty())
        client_->read_into(key, 0, std::as_writable_bytes(std::span(bytes)), io, "check", version->tag);
    } catch (const Error&) {
      return false;  // replaced or removed meanwhile: not ours to claim
    }
    return std::memcmp(bytes.data(), data.data(), data.size()) == 0;
  }

  ObjectClient::Version existing(std::string_view key, const IoOptions& io, const std::string& op) {
    std::optional<ObjectClient::Version> version = client_->head(key, io, op);
    if (!version)
      throw StorageError(StorageError::Kind::kNotFound, op + " " + client_->describe(key) + ": no such object");
    return *version;
  }

  std::shared_ptr<ObjectClient> client_;
  std::string query_;
  // The read-ahead memory of all the windowed sources this storage opens (a load's rank reads
  // several objects at once): one source's windows x window_bytes, shared.
  std::shared_ptr<ReadAheadBudget> read_budget_;
};

}  // namespace

std::optional<ObjectClient::FirstBytes> ObjectClient::read_first(std::string_view key, std::size_t max_bytes,
                                                                 const IoOptions& io, const std::string& op) {
  return open_with_head(key, max_bytes, io, op);
}

std::optional<ObjectClient::FirstBytes> ObjectClient::open_with_head(std::string_view key, std::size_t max_bytes,
                                                                     const IoOptions& io, const std::string& op) {
  std::optional<Version> version = head(key, io, op);
  if (!version) return std::nullopt;
  FirstBytes found{*version, nullptr, 0};
  if (version->size > 0 && version->size <= max_bytes) {
    found.length = static_cast<std::size_t>(version->size);
    found.bytes = std::make_shared_for_overwrite<std::byte[]>(found.length);
    read_into(key, 0, std::span(found.bytes.get(), found.length), io, op, version->tag);
  }
  return found;
}

StorageError conflict_error(const std::string& what, long status, const std::string& code) {
  return StorageError(StorageError::Kind::kAlreadyExists,
                      what + ": already exists (HTTP " + std::to_string(status) + (code.empty() ? "" : " " + code) +
                          ": another writer published it first; create-only write refused)");
}

std::unique_ptr<Storage> make_object_store_storage(std::shared_ptr<ObjectClient> client, std::string query) {
  return std::make_unique<ObjectStoreStorage>(std::move(client), std::move(query));
}

}  // namespace shardpoint::storage::http
