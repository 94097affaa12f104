// FaultInjectionStorage: a StorageWrapper that makes chosen calls fail, for engine tests
// such as "if any rank fails to write, no .metadata appears".
//
// Calls are counted per operation kind (1-based, across all keys matching the rule's
// filter, and across all writers this wrapper opened). A rule fires on the Nth matching
// call, throws StorageError of the chosen kind *instead of* forwarding that call, and fires
// once; the calls after it pass through. Several rules may be armed at once.
//
// Writers it hands out count their calls here: REQUIRES that they do not outlive it.
//
// Thread-safety: thread-safe; counts are exact under concurrency (which call is "Nth" then
// depends on scheduling).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"
#include "storage/storage_wrapper.h"

namespace shardpoint::storage {

enum class FaultOp {
  kRead,         // read() and open_source()
  kStat,         // stat() and try_stat()
  kOpenWriter,   // open_writer()
  kWrite,        // StorageWriter::append() / write() / write_at()
  kCommit,       // StorageWriter::commit()
  kWriteAtomic,  // write_atomic()
  kList,         // list()
  kRemove,       // remove() and remove_prefix()
};
inline constexpr std::size_t kFaultOpCount = 8;

struct FaultRule {
  FaultOp op = FaultOp::kWrite;
  // Fire on the Nth matching call (1 = the first).
  std::uint64_t nth = 1;
  StorageError::Kind kind = StorageError::Kind::kTransient;
  // Only calls whose key (or prefix) contains this string count; empty matches all.
  std::string key_contains;
};

class FaultInjectionStorage final : public StorageWrapper {
 public:
  explicit FaultInjectionStorage(std::shared_ptr<Storage> target) : StorageWrapper(std::move(target)) {}

  // Arms a rule. Counting for it starts now.
  void fail(FaultRule rule);
  // Shorthand: fail the nth call of op with kind.
  void fail_nth(FaultOp op, std::uint64_t nth, StorageError::Kind kind = StorageError::Kind::kTransient) {
    fail(FaultRule{op, nth, kind, {}});
  }
  // Disarms every rule (counts are kept).
  void clear();
  // Calls of op seen so far (including failed ones).
  std::uint64_t calls(FaultOp op) const;
  // Faults injected so far.
  std::uint64_t injected() const;

  std::uint64_t stat(std::string_view key, const IoOptions& io = {}) override;
  std::optional<std::uint64_t> try_stat(std::string_view key, const IoOptions& io = {}) override;
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io = {}) override;
  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options = {},
                                          const IoOptions& io = {}) override;
  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options = {},
                                             const IoOptions& io = {}) override;
  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options = {},
                    const IoOptions& io = {}) override;
  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io = {}) override;
  void remove(std::string_view key, const IoOptions& io = {}) override;
  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io = {}) override;

  // Counts the call and throws if an armed rule fires. Used by the writers it hands out.
  void on_call(FaultOp op, std::string_view key);

 private:
  struct Armed {
    FaultRule rule;
    std::uint64_t seen = 0;
  };
  mutable Mutex mu_;
  std::vector<Armed> armed_ SP_GUARDED_BY(mu_);
  std::array<std::uint64_t, kFaultOpCount> calls_ SP_GUARDED_BY(mu_) = {};
  std::uint64_t injected_ SP_GUARDED_BY(mu_) = 0;
};

}  // namespace shardpoint::storage
