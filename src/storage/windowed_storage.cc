#include "storage/windowed_storage.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/mutex.h"
#include "storage/storage_wrapper.h"

namespace shardpoint::storage {
namespace {

// The shared windows: the kWindows most recently read aligned kWindowBytes ranges of any
// object, replaced round-robin.
class WindowCache {
 public:
  // Fills out from the window of object `key` (read through `inner`) that holds [offset,
  // offset + out.size()), reading the window when it is not cached. Returns false when the
  // range crosses a window boundary.
  bool read(const ByteSource& inner, const std::string& key, std::uint64_t offset, std::span<std::byte> out,
            std::string_view what) {
    const std::uint64_t start = offset / kWindowBytes * kWindowBytes;
    if (offset + out.size() > start + kWindowBytes) return false;
    MutexLock lock(mu_);
    Window* w = nullptr;
    for (Window& c : windows_) {
      if (c.start == start && c.key == key) w = &c;
    }
    if (w == nullptr) {
      if (windows_.size() < kWindows) windows_.emplace_back();
      w = &windows_[next_++ % windows_.size()];
      w->key.clear();  // stays invalid if the read throws
      w->bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kWindowBytes, inner.size() - start)));
      inner.read(start, w->bytes, what);
      w->key = key;
      w->start = start;
    }
    std::memcpy(out.data(), w->bytes.data() + (offset - start), out.size());
    return true;
  }

 private:
  struct Window {
    std::string key;
    std::uint64_t start = 0;
    std::vector<std::byte> bytes;
  };
  Mutex mu_;
  std::vector<Window> windows_ SP_GUARDED_BY(mu_);
  std::size_t next_ SP_GUARDED_BY(mu_) = 0;
};

// A whole object read with ranged Storage::read calls (remote drivers: one GET each, into
// the caller's buffer).
class RangedReadSource final : public ByteSource {
 public:
  RangedReadSource(std::shared_ptr<Storage> st, std::string key, std::uint64_t size)
      : st_(std::move(st)), key_(std::move(key)), name_(st_->describe_key(key_)), size_(size) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (!out.empty()) st_->read(key_, offset, out);
  }

 private:
  std::shared_ptr<Storage> st_;
  std::string key_;
  std::string name_;
  std::uint64_t size_;
};

class WindowedSource final : public ByteSource {
 public:
  WindowedSource(std::shared_ptr<const ByteSource> inner, std::string key, std::shared_ptr<WindowCache> cache)
      : inner_(std::move(inner)), key_(std::move(key)), cache_(std::move(cache)) {}
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t size() const override { return inner_->size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (out.empty()) return;
    if (out.size() < kWindowBytes / 2 && cache_->read(*inner_, key_, offset, out, what)) return;
    inner_->read(offset, out, what);
  }

 private:
  std::shared_ptr<const ByteSource> inner_;
  std::string key_;
  std::shared_ptr<WindowCache> cache_;
};

// Every source is a WindowedSource, over a pread source (local files, never mapped) or over
// ranged reads (object stores).
class WindowedStorage final : public StorageWrapper {
 public:
  explicit WindowedStorage(std::shared_ptr<Storage> target)
      : StorageWrapper(target), target_(std::move(target)), cache_(std::make_shared<WindowCache>()) {}
  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions&, const IoOptions& io) override {
    std::shared_ptr<const ByteSource> inner;
    if (target_->features().local_path) {
      SourceOptions pread;
      pread.prefer_mmap = false;
      inner = target_->open_source(key, pread, io);
    } else {
      inner = std::make_shared<RangedReadSource>(target_, std::string(key), target_->stat(key, io));
    }
    return std::make_unique<WindowedSource>(std::move(inner), std::string(key), cache_);
  }
  std::optional<std::string> try_read_all(std::string_view key, const IoOptions& io) override {
    return target_->try_read_all(key, io);
  }

 private:
  std::shared_ptr<Storage> target_;
  std::shared_ptr<WindowCache> cache_;
};

}  // namespace

std::shared_ptr<Storage> make_windowed_storage(std::shared_ptr<Storage> target) {
  return std::make_shared<WindowedStorage>(std::move(target));
}

}  // namespace shardpoint::storage
