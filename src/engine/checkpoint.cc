// save(): the executor of save plans (load() is in checkpoint_load.cc).
//
// Save:
//   1. (all ranks)   flatten the state, make the local plan.
//   2. (coordinator) gather the plans, deduplicate replicated items, assign files
//                    __{rank}_{n}.distcp, scatter the final plans.
//   3. (all ranks)   write the items of each own file (files_per_rank() in parallel),
//                    each item a complete torch.save blob, checksummed as it streams out.
//   4. (all ranks)   every rank learns whether any rank failed; if one did, every rank
//                    throws an error naming the failed ranks and nothing is committed.
//   5. (coordinator) gather the write results; write the checksum sidecar
//                    (kChecksumSidecar) and the load index (kIndexKey), then `.metadata`
//                    atomically (tmp + fsync + rename + directory fsync). `.metadata` is
//                    the commit marker: without it no reader sees a checkpoint.
//   6. (all ranks)   barrier: when save() returns on any rank the checkpoint is committed.
//
// Items: each is a complete torch.save blob (archive "archive"): a tensor chunk as
// _rebuild_tensor_v2 over a storage holding exactly the chunk's row-major bytes, a bytes
// item as torch.save of the object's pickle value. Blobs of one file follow each other
// without padding, bytes items first (item_writer.h). Checksums: checksum_sidecar.h.
//
// Failure: messages between ranks start with a RankStatus byte (plan_codec.h), so a
// failure on one rank turns into the same error on every rank without extra collectives:
// a step's expected status (kPlan, kWriteResult, kMetadata) + its body on success,
// kError + comm::encode_error(...) when this rank (or, from the coordinator, the job)
// failed. rank_failures.h makes one error of the failures of several ranks.
#include "shardpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "core/kill_point.h"
#include "engine/block_checksum.h"
#include "engine/checkpoint_index.h"
#include "engine/checksum_sidecar.h"
#include "engine/compress_ahead.h"
#include "engine/flatten.h"
#include "engine/item_writer.h"
#include "engine/parallel_for.h"
#include "engine/plan_codec.h"
#include "engine/rank_failures.h"
#include "engine/save_plan.h"
#include "engine/save_steps.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best effort: the caller is failing anyway, and without `.metadata` the sidecar and the
// index describe a checkpoint that does not exist.
void remove_sidecar_and_index_quietly(storage::Storage& st) noexcept {
  for (const char* key : {kChecksumSidecar, kIndexKey}) {
    try {
      st.remove(key);
    } catch (...) {
    }
  }
}

// ---------------------------------------------------------------------------------------
// Save, step 3: this rank's files.

using save_steps::CommittedFiles;
using save_steps::FileToWrite;
using save_steps::ItemToWrite;

std::vector<WrittenItem> write_files(const SavePlan& plan, const FlatStateDict& flat, storage::Storage& st,
                                     const SaveOptions& options, CommittedFiles& committed) {
  std::vector<FileToWrite> files;
  std::map<std::string, std::size_t> position;
  for (const std::string& file : plan.files) {
    position.emplace(file, files.size());
    files.push_back({file, {}});
  }
  for (const WriteItem& item : plan.items) {
    auto it = position.find(item.file);
    if (it == position.end()) {
      throw UsageError("save: item \"" + item.index.fqn + "\" is planned into \"" + item.file +
                       "\", which is not one of this rank's files");
    }
    auto value = flat.items.find(item.index.fqn);
    if (value == flat.items.end()) {
      throw UsageError("save: item \"" + item.index.fqn + "\" is in the plan but not in this rank's state");
    }
    files[it->second].items.push_back({&item, &value->second, {}});
  }
  for (FileToWrite& file : files) {
    std::sort(file.items.begin(), file.items.end(),
              [](const ItemToWrite& a, const ItemToWrite& b) { return a.item->index_in_file < b.item->index_in_file; });
  }
  return save_steps::write_item_files(files, st, options, committed);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Save steps (save_steps.h), shared by save() and async_save().

namespace save_steps {

void CommittedFiles::add(std::string key) {
  MutexLock lock(mu_);
  keys_.push_back(std::move(key));
}

void CommittedFiles::remove_all(storage::Storage& st) noexcept {
  MutexLock lock(mu_);
  for (const auto& key : keys_) {
    try {
      st.remove(key);
    } catch (...) {
    }
  }
  keys_.clear();
}

PlannedSave plan_save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                      const SaveOptions& options, const std::function<void(const FlatStateDict&)>& check_local) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  PlannedSave planned;
  kill_point(KillPoint::kPlan);

  // 1. (all ranks) Flatten, local plan.
  std::string local;
  try {
    if (options.thread_count < 1) {
      throw UsageError("save: thread_count must be >= 1, found " + std::to_string(options.thread_count));
    }
    if (options.checksum_block_bytes == 0) throw UsageError("save: checksum_block_bytes must be > 0");
    planned.flat = flatten_state_dict(state);
    if (check_local) check_local(planned.flat);
    local = encode_rank_message(RankStatus::kPlan, encode_save_plan(make_local_save_plan(planned.flat, rank)));
  } catch (...) {
    local = encode_rank_message(RankStatus::kError, encode_current());
  }

  // 2. (coordinator) Global plan; scatter each rank's final plan (or the job's failure).
  std::vector<std::string> gathered = comm.gather(std::move(local));
  std::vector<std::string> pieces;
  if (comm.is_coordinator()) {
    std::vector<RankFailure> failures;
    std::vector<SavePlan> plans;
    for (int r = 0; r < world; ++r) {
      const std::string& m = gathered[static_cast<std::size_t>(r)];
      const RankMessage message = decode_rank_message(m);
      if (message.status != RankStatus::kPlan) {
        failures.push_back({r, m.empty() ? std::string("error\nempty plan message") : std::string(message.body)});
      }
    }
    if (failures.empty()) {
      try {
        for (int r = 0; r < world; ++r) {
          plans.push_back(decode_save_plan(decode_rank_message(gathered[static_cast<std::size_t>(r)]).body,
                                           "save: plan of rank " + std::to_string(r)));
        }
        SavePlanOptions plan_options;
        plan_options.thread_count = files_per_rank(options.thread_count, checkpoint.features());
        plan_options.single_file_per_rank = true;
        plan_options.dedup_to_lowest_rank = options.dedup_to_lowest_rank;
        GlobalSavePlan global = make_global_save_plan(std::move(plans), plan_options);
        // Saving over a committed checkpoint un-commits it first: its data files are about
        // to be overwritten, so its `.metadata` must not outlive them.
        checkpoint.remove(kMetadataKey);
        checkpoint.remove(kChecksumSidecar);
        checkpoint.remove(kIndexKey);
        for (const SavePlan& p : global.plans)
          pieces.push_back(encode_rank_message(RankStatus::kPlan, encode_save_plan(p)));
        planned.metadata = std::move(global.metadata);
      } catch (...) {
        failures = {{0, encode_current()}};
      }
    }
    if (!failures.empty()) {
      pieces.assign(static_cast<std::size_t>(world),
                    encode_rank_message(RankStatus::kError, combine_failures("save", failures, world)));
    }
  }
  gathered.clear();
  const std::string mine = comm.scatter(std::move(pieces));
  const RankMessage final_plan = decode_rank_message(mine);
  if (final_plan.status != RankStatus::kPlan) {
    throw_encoded(mine.empty() ? "error\nsave: empty plan" : std::string(final_plan.body));
  }
  planned.plan = decode_save_plan(final_plan.body, "save: final plan");
  return planned;
}

std::vector<WrittenItem> write_item_files(const std::vector<FileToWrite>& files, storage::Storage& st,
                                          const SaveOptions& options, CommittedFiles& committed) {
  // The data files of a committed checkpoint are never written again, whatever a plan
  // says: a save over one un-commits it first (save() removes its `.metadata` before the
  // plan reaches the ranks; the Python writer stages beside a local one), so a `.metadata`
  // here means the caller would change the bytes that metadata describes.
  if (st.try_stat(kMetadataKey)) {
    throw UsageError(st.describe_key(kMetadataKey) +
                     ": the folder holds a committed checkpoint; its data files are not written again (save into "
                     "another folder, or remove this checkpoint first)");
  }
  std::vector<std::vector<WrittenItem>> results(files.size());
  ItemWriteOptions item_options;
  item_options.checksum = options.checksum;
  item_options.block_size = options.checksum_block_bytes;
  item_options.compression = options.compression;
  item_options.zstd_level = options.compression_level;
  // Every value (the state's tensors, the caller's serialized blobs) outlives the writers,
  // which are committed or destroyed in this call.
  item_options.borrow_values = true;
  storage::WriteOptions write_options;
  write_options.durable = options.durable;
  write_options.direct_io = options.direct_io;

  const int threads = files_per_rank(std::max(options.thread_count, 1), st.features());
  // zstd: the items are compressed by a pool shared by the files (compress_ahead.h).
  std::optional<CompressionPool> pool;
  if (options.compression == Compression::kZstd && compression_thread_count(options) > 1) {
    pool.emplace(compression_thread_count(options));
  }
  parallel_for(files.size(), static_cast<std::size_t>(threads), [&](std::size_t i) {
    const std::string& file = files[i].name;
    std::unique_ptr<storage::StorageWriter> writer = st.open_writer(file, write_options);
    const ItemWriteFn write_one = [&](const ItemToWrite& entry, ByteSink& sink, const ItemWriteOptions& opts) {
      return entry.value != nullptr ? write_item(sink, file, *entry.item, *entry.value, opts)
                                    : write_serialized_item(sink, file, entry.item->index, entry.serialized, opts);
    };
    const auto appended = [&] {
      if (i == 0 && results[i].size() == 1) kill_point(KillPoint::kDataWrite);  // once per save and rank
    };
    if (pool) {
      write_compressed_ahead(*writer, files[i], item_options, *pool, write_one, results[i], appended);
    } else {
      for (const ItemToWrite& entry : files[i].items) {
        try {
          results[i].push_back(write_one(entry, *writer, item_options));
        } catch (const StorageError&) {
          rethrow_with_context("save: " + file + ": item \"" + entry.item->index.fqn + "\"");
        }
        appended();
      }
    }
    writer->commit();
    committed.add(file);
  });

  std::vector<WrittenItem> all;
  for (auto& r : results) std::move(r.begin(), r.end(), std::back_inserter(all));
  return all;
}

std::string write_rank_files(const SavePlan& plan, const FlatStateDict& flat, storage::Storage& checkpoint,
                             const SaveOptions& options, CommittedFiles& committed, std::uint64_t& bytes_written) {
  try {
    std::vector<WrittenItem> written = write_files(plan, flat, checkpoint, options, committed);
    for (const WrittenItem& w : written) bytes_written += w.info.length;
    return encode_rank_message(RankStatus::kWriteResult, encode_written_items(written));
  } catch (...) {
    return encode_rank_message(RankStatus::kError, encode_current());
  }
}

std::string failed_write_result(std::exception_ptr error) {
  return encode_rank_message(RankStatus::kError, comm::encode_error(error));
}

// Step 5 (the coordinator; reshard() too): sidecar, then `.metadata`.

void commit_checkpoint(storage::Storage& st, format::Metadata metadata,
                       const std::vector<std::vector<WrittenItem>>& written, const SaveOptions& options) {
  for (const auto& rank_items : written) {
    for (const WrittenItem& w : rank_items) {
      if (!metadata.storage_data.emplace(w.index, w.info).second) {
        throw Error("save: item \"" + w.index.fqn + "\" was written twice (internal error)");
      }
    }
  }
  // Every chunk and bytes item of the index must have been written by some rank.
  for (const auto& [fqn, entry] : metadata.state_dict_metadata) {
    if (const auto* tensor = std::get_if<format::TensorStorageMetadata>(&entry)) {
      for (const auto& chunk : tensor->chunks) {
        if (!metadata.storage_data.contains(format::MetadataIndex{fqn, chunk.offsets, std::nullopt})) {
          throw Error("save: tensor \"" + fqn + "\" chunk " + format::describe_chunk(chunk) +
                      " was planned but no rank wrote it (internal error)");
        }
      }
    } else if (!metadata.storage_data.contains(format::MetadataIndex{fqn, std::nullopt, std::nullopt})) {
      throw Error("save: object \"" + fqn + "\" was planned but no rank wrote it (internal error)");
    }
  }
  publish_checkpoint(st, format::encode_metadata(metadata), &metadata, written, options);
}

void publish_checkpoint(storage::Storage& st, std::string_view metadata_bytes, const format::Metadata* metadata,
                        const std::vector<std::vector<WrittenItem>>& written, const SaveOptions& options) {
  ChecksumSidecar sidecar(options.checksum, options.checksum_block_bytes);
  std::map<format::MetadataIndex, std::uint64_t> data_offsets;
  const bool checksummed = options.checksum != ChecksumAlgorithm::kNone;
  for (const auto& rank_items : written) {
    for (const WrittenItem& w : rank_items) {
      if (w.data_offset) data_offsets.emplace(w.index, *w.data_offset);
      if (checksummed) {
        sidecar.add(ItemChecksums{w.info.relative_path, w.info.offset, w.info.length, w.index.fqn, w.index.offset,
                                  w.checksum, w.blocks});
      }
    }
  }
  storage::WriteOptions wo;
  wo.durable = options.durable;
  wo.direct_io = false;
  try {
    // The sidecar and the index first: once `.metadata` exists, every blob it names has
    // its checksums, and the index that matches it is in place.
    kill_point(KillPoint::kSidecar);
    if (checksummed) st.write_atomic(kChecksumSidecar, as_bytes(sidecar.encode()), wo);
    // Not durable on its own: an index a crash damages fails its checks and loads ignore
    // it, so it needs no fsync of its own (the `.metadata` commit below syncs the folder).
    kill_point(KillPoint::kLoadIndex);
    if (metadata != nullptr) {
      storage::WriteOptions index_wo = wo;
      index_wo.durable = false;
      st.write_atomic(kIndexKey,
                      as_bytes(encode_checkpoint_index(*metadata, as_bytes(metadata_bytes),
                                                       checksummed ? &sidecar : nullptr, data_offsets)),
                      index_wo);
    }
    // The commit marker (tmp + fsync + rename + directory fsync when durable), create-only:
    // save() removed any previous `.metadata` when it planned, so one here now was committed
    // by another save into the same folder meanwhile, and only one of the two may succeed.
    kill_point(KillPoint::kMetadata);
    storage::WriteOptions commit_wo = wo;
    commit_wo.if_absent = true;
    st.write_atomic(kMetadataKey, as_bytes(metadata_bytes), commit_wo);
  } catch (const StorageError& e) {
    if (e.kind() != StorageError::Kind::kAlreadyExists) {
      remove_sidecar_and_index_quietly(st);
      throw;
    }
    // The sidecar and index may be the other save's now: leave them with its `.metadata`.
    throw StorageError(StorageError::Kind::kAlreadyExists,
                       std::string("save: not committed: ") + e.what() +
                           "; another save committed into this folder while this one wrote it, so its files may "
                           "be a mixture of both saves (run `shardpoint verify` on it)");
  } catch (...) {
    remove_sidecar_and_index_quietly(st);
    throw;
  }
}

void commit_save(std::string write_result, format::Metadata metadata, storage::Storage& checkpoint,
                 comm::Communicator& comm, const SaveOptions& options, CommittedFiles& committed) {
  const int world = comm.world_size();
  try {
    // 4-5. Gather the results; the coordinator commits only when every rank succeeded.
    std::vector<std::string> results = comm.gather(std::move(write_result));
    std::string status;
    if (comm.is_coordinator()) {
      std::vector<RankFailure> failures;
      for (int r = 0; r < world; ++r) {
        const std::string& m = results[static_cast<std::size_t>(r)];
        const RankMessage message = decode_rank_message(m);
        if (message.status != RankStatus::kWriteResult) {
          failures.push_back({r, m.empty() ? std::string("error\nno result") : std::string(message.body)});
        }
      }
      if (failures.empty()) {
        try {
          std::vector<std::vector<WrittenItem>> written;
          written.reserve(static_cast<std::size_t>(world));
          for (int r = 0; r < world; ++r) {
            written.push_back(decode_written_items(decode_rank_message(results[static_cast<std::size_t>(r)]).body,
                                                   "save: results of rank " + std::to_string(r)));
          }
          commit_checkpoint(checkpoint, std::move(metadata), written, options);
        } catch (...) {
          failures = {{0, encode_current()}};
        }
      }
      if (!failures.empty()) status = combine_failures("save", failures, world);
    }
    // 6. (all ranks) The outcome; this broadcast is also the final barrier: the coordinator
    // sends it only after `.metadata` is durable, so when save() returns on any rank the
    // checkpoint is committed.
    status = comm.broadcast(std::move(status));
    if (!status.empty()) throw_encoded(status);
  } catch (...) {
    committed.remove_all(checkpoint);
    throw;
  }
}

}  // namespace save_steps

SaveReport save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                const SaveOptions& options) {
  SaveReport report;
  const auto t_plan = Clock::now();
  save_steps::PlannedSave planned = save_steps::plan_save(state, checkpoint, comm, options);
  report.files = planned.plan.files;
  report.plan_seconds = seconds_since(t_plan);

  // 3. (all ranks) Write this rank's files, files_per_rank() in parallel (save_plan.h).
  const auto t_write = Clock::now();
  CommittedFiles committed;
  std::string result =
      save_steps::write_rank_files(planned.plan, planned.flat, checkpoint, options, committed, report.bytes_written);
  report.write_seconds = seconds_since(t_write);

  const auto t_commit = Clock::now();
  save_steps::commit_save(std::move(result), std::move(planned.metadata), checkpoint, comm, options, committed);
  report.commit_seconds = seconds_since(t_commit);
  return report;
}

}  // namespace shardpoint::engine
