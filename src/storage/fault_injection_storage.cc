#include "storage/fault_injection_storage.h"
#include "shardpoint/mutex.h"

namespace shardpoint::storage {
namespace {

const char* op_name(FaultOp op) {
  switch (op) {
    case FaultOp::kRead: return "read";
    case FaultOp::kStat: return "stat";
    case FaultOp::kOpenWriter: return "open_writer";
    case FaultOp::kWrite: return "write";
    case FaultOp::kCommit: return "commit";
    case FaultOp::kWriteAtomic: return "write_atomic";
    case FaultOp::kList: return "list";
    case FaultOp::kRemove: return "remove";
  }
  return "?";
}

// Forwards to the real writer after asking the wrapper whether this call fails.
class FaultInjectionWriter final : public StorageWriter {
 public:
  FaultInjectionWriter(FaultInjectionStorage* owner, std::unique_ptr<StorageWriter> target)
      : owner_(owner), target_(std::move(target)) {}
  void append(ByteSpan data, const IoOptions& io) override {
    owner_->on_call(FaultOp::kWrite, target_->key());
    target_->append(data, io);
  }
  void write_at(std::uint64_t offset, ByteSpan data, const IoOptions& io) override {
    owner_->on_call(FaultOp::kWrite, target_->key());
    target_->write_at(offset, data, io);
  }
  std::uint64_t position() const override { return target_->position(); }
  void commit(const IoOptions& io) override {
    owner_->on_call(FaultOp::kCommit, target_->key());
    target_->commit(io);
  }
  const std::string& key() const override { return target_->key(); }

 private:
  FaultInjectionStorage* owner_;  // not owned; outlives the writer (REQUIRES in header)
  std::unique_ptr<StorageWriter> target_;
};

}  // namespace

void FaultInjectionStorage::fail(FaultRule rule) {
  MutexLock lock(mu_);
  armed_.push_back(Armed{std::move(rule), 0});
}

void FaultInjectionStorage::clear() {
  MutexLock lock(mu_);
  armed_.clear();
}

std::uint64_t FaultInjectionStorage::calls(FaultOp op) const {
  MutexLock lock(mu_);
  return calls_[static_cast<std::size_t>(op)];
}

std::uint64_t FaultInjectionStorage::injected() const {
  MutexLock lock(mu_);
  return injected_;
}

void FaultInjectionStorage::on_call(FaultOp op, std::string_view key) {
  MutexLock lock(mu_);
  ++calls_[static_cast<std::size_t>(op)];
  for (auto it = armed_.begin(); it != armed_.end(); ++it) {
    if (it->rule.op != op) continue;
    if (!it->rule.key_contains.empty() && key.find(it->rule.key_contains) == std::string_view::npos) continue;
    if (++it->seen < it->rule.nth) continue;
    std::uint64_t nth = it->rule.nth;
    StorageError::Kind kind = it->rule.kind;
    armed_.erase(it);
    ++injected_;
    throw StorageError(
        kind, std::string("injected fault: ") + op_name(op) + " #" + std::to_string(nth) + " of " + describe_key(key));
  }
}

std::uint64_t FaultInjectionStorage::stat(std::string_view key, const IoOptions& io) {
  on_call(FaultOp::kStat, key);
  return StorageWrapper::stat(key, io);
}

std::optional<std::uint64_t> FaultInjectionStorage::try_stat(std::string_view key, const IoOptions& io) {
  on_call(FaultOp::kStat, key);
  return StorageWrapper::try_stat(key, io);
}

void FaultInjectionStorage::read(std::string_view key, std::uint64_t offset, std::span<std::byte> out,
                                 const IoOptions& io) {
  on_call(FaultOp::kRead, key);
  StorageWrapper::read(key, offset, out, io);
}

std::unique_ptr<ByteSource> FaultInjectionStorage::open_source(std::string_view key, const SourceOptions& options,
                                                               const IoOptions& io) {
  on_call(FaultOp::kRead, key);
  return StorageWrapper::open_source(key, options, io);
}

std::unique_ptr<StorageWriter> FaultInjectionStorage::open_writer(std::string_view key, const WriteOptions& options,
                                                                  const IoOptions& io) {
  on_call(FaultOp::kOpenWriter, key);
  return std::make_unique<FaultInjectionWriter>(this, StorageWrapper::open_writer(key, options, io));
}

void FaultInjectionStorage::write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options,
                                         const IoOptions& io) {
  on_call(FaultOp::kWriteAtomic, key);
  StorageWrapper::write_atomic(key, data, options, io);
}

std::vector<ObjectInfo> FaultInjectionStorage::list(std::string_view prefix, const IoOptions& io) {
  on_call(FaultOp::kList, prefix);
  return StorageWrapper::list(prefix, io);
}

void FaultInjectionStorage::remove(std::string_view key, const IoOptions& io) {
  on_call(FaultOp::kRemove, key);
  StorageWrapper::remove(key, io);
}

std::size_t FaultInjectionStorage::remove_prefix(std::string_view prefix, const IoOptions& io) {
  on_call(FaultOp::kRemove, prefix);
  return StorageWrapper::remove_prefix(prefix, io);
}

}  // namespace shardpoint::storage
