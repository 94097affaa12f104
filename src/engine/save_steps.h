// The steps of save() (numbered as in checkpoint.cc) as separate functions, so that save()
// and async_save() (async_save.h) run the same code: async_save() runs steps 1-2 on the
// caller's thread, step 3 on a background thread over staged copies of the tensors, and
// steps 4-6 in PendingSave::wait(). Internal to the engine; implemented in checkpoint.cc.
//
// reshard() (reshard.h), which writes every rank's files in one process, commits through
// commit_checkpoint(), the coordinator's part of step 5.
//
// Thread-safety: plan_save() and commit_save() use the communicator (one call at a time
// per communicator); write_rank_files() and commit_checkpoint() never do and may run on any
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/flatten.h"
#include "engine/item_writer.h"
#include "engine/save_plan.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator.h"
#include "shardpoint/metadata.h"
#include "shardpoint/mutex.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine::save_steps {

// The files this rank has published in one save attempt, removed again when it fails.
class CommittedFiles {
 public:
  void add(std::string key);
  // Best effort: a failure to remove is ignored (the save is failing anyway and
  // `.metadata` was never written, so the files are invisible to loaders).
  void remove_all(storage::Storage& st) noexcept;

 private:
  Mutex mu_;
  std::vector<std::string> keys_ SP_GUARDED_BY(mu_);
};

// What steps 1-2 hand to the later steps.
struct PlannedSave {
  FlatStateDict flat;         // this rank's leaves; tensor spans alias the caller's buffers
  SavePlan plan;              // this rank's final plan (files and items it writes)
  format::Metadata metadata;  // coordinator only: the global plan's skeleton
};

// Steps 1-2 (collective). `check_local`, when set, runs on this rank's flattened state in
// step 1, so an error it throws fails the save on every rank like a planning error.
// Throws the agreed error on every rank; nothing has been written then.
PlannedSave plan_save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                      const SaveOptions& options, const std::function<void(const FlatStateDict&)>& check_local = {});

// One item of a file being written: from its leaf (`value`), or, when value is null, the
// blob `serialized` verbatim (an item another writer already serialized: DCP's bytes items).
struct ItemToWrite {
  const WriteItem* item = nullptr;  // the item's index names it in the results
  const FlatValue* value = nullptr;
  ByteSpan serialized;
};

// A file and its items, in file order.
struct FileToWrite {
  std::string name;
  std::vector<ItemToWrite> items;
};

// Step 3's I/O: writes each file (files_per_rank(options.thread_count, ...) at a time),
// commits it and records it in `committed`. Returns every written item, file by file. Throws UsageError for an
// item that does not match its value, and before writing anything when `checkpoint` holds a
// committed `.metadata` (a committed checkpoint's files are never written again);
// StorageError naming the file and item.
std::vector<WrittenItem> write_item_files(const std::vector<FileToWrite>& files, storage::Storage& checkpoint,
                                          const SaveOptions& options, CommittedFiles& committed);

// Step 3 on this rank (no communicator): writes the files of `plan` from `flat`. Returns
// the message commit_save() exchanges: RankStatus::kWriteResult + the written items, or
// RankStatus::kError + this rank's error (plan_codec.h). Does not throw. Adds the blob
// bytes written to `bytes_written`.
std::string write_rank_files(const SavePlan& plan, const FlatStateDict& flat, storage::Storage& checkpoint,
                             const SaveOptions& options, CommittedFiles& committed, std::uint64_t& bytes_written);

// The message of a rank that failed before or instead of step 3.
std::string failed_write_result(std::exception_ptr error);

// Step 5 without a communicator (the coordinator's part): records every written item in
// `metadata.storage_data`, then writes the checksum sidecar (unless options.checksum is
// kNone) and `.metadata`, each with write_atomic (tmp + fsync + rename + directory fsync
// when options.durable). The sidecar goes first: once `.metadata` exists, every blob it
// names has its checksums. `written` holds the items of every rank, in any grouping.
// Throws Error (internal) when an item was written twice or a planned chunk or object by
// no one, StorageError from writing; a failed write removes the sidecar again (best
// effort).
void commit_checkpoint(storage::Storage& checkpoint, format::Metadata metadata,
                       const std::vector<std::vector<WrittenItem>>& written, const SaveOptions& options);

// The writes of step 5 for metadata already encoded (`metadata_bytes`, which must name every
// written item in its storage_data): the checksum sidecar from `written` (unless
// options.checksum is kNone), the load index when `metadata` (the decoded form of
// metadata_bytes) is given, then `.metadata` = metadata_bytes, each with write_atomic
// (`.metadata` create-only: WriteOptions::if_absent). A
// save planned by PyTorch's DCP (whose `.metadata` pickle Python writes) commits through it.
// Throws StorageError; a failed write removes the sidecar and index again (best effort),
// except a `.metadata` that another writer committed first (kAlreadyExists): then they are
// left to it.
void publish_checkpoint(storage::Storage& checkpoint, std::string_view metadata_bytes, const format::Metadata* metadata,
                        const std::vector<std::vector<WrittenItem>>& written, const SaveOptions& options);

// Steps 4-6 (collective): agree on the results, the coordinator commits (sidecar, then
// `.metadata`), final broadcast. When any rank failed, throws the combined error on every
// rank after removing this rank's committed files (and, on the coordinator, the sidecar).
void commit_save(std::string write_result, format::Metadata metadata, storage::Storage& checkpoint,
                 comm::Communicator& comm, const SaveOptions& options, CommittedFiles& committed);

}  // namespace shardpoint::engine::save_steps
