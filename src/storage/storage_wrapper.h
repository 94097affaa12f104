// StorageWrapper: a Storage that forwards every call to another one, so a subclass can
// override the one method it changes (LevelDB's EnvWrapper). Fault injection, throttling
// and metrics are wrappers, not flags on drivers. try_read_all() is the one call not
// forwarded: its default goes through the wrapper's try_stat() and read().
//
// Thread-safety: as the wrapped Storage; the wrapper adds no state.
#pragma once

#include <memory>
#include <utility>

#include "shardpoint/storage.h"

namespace shardpoint::storage {

class StorageWrapper : public Storage {
 public:
  // REQUIRES: target != nullptr. Shares ownership of target.
  explicit StorageWrapper(std::shared_ptr<Storage> target) : target_(std::move(target)) {}

  Storage& target() const { return *target_; }

  StorageFeatures features() const override { return target_->features(); }
  std::string url() const override { return target_->url(); }
  std::string describe_key(std::string_view key) const override { return target_->describe_key(key); }
  std::uint64_t stat(std::string_view key, const IoOptions& io = {}) override { return target_->stat(key, io); }
  std::optional<std::uint64_t> try_stat(std::string_view key, const IoOptions& io = {}) override {
    return target_->try_stat(key, io);
  }
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io = {}) override {
    target_->read(key, offset, out, io);
  }
  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options = {},
                                          const IoOptions& io = {}) override {
    return target_->open_source(key, options, io);
  }
  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options = {},
                                             const IoOptions& io = {}) override {
    return target_->open_writer(key, options, io);
  }
  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options = {},
                    const IoOptions& io = {}) override {
    target_->write_atomic(key, data, options, io);
  }
  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io = {}) override {
    return target_->list(prefix, io);
  }
  void remove(std::string_view key, const IoOptions& io = {}) override { target_->remove(key, io); }
  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io = {}) override {
    return target_->remove_prefix(prefix, io);
  }
  std::optional<std::string> local_path(std::string_view key) const override { return target_->local_path(key); }

 private:
  std::shared_ptr<Storage> target_;
};

}  // namespace shardpoint::storage
