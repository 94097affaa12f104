// save() and load(): the executor of the plans.
//
// Save:
//   1. (all ranks)   flatten the state, make the local plan.
//   2. (coordinator) gather the plans, deduplicate replicated items, assign files
//                    __{rank}_{n}.distcp, scatter the final plans.
//   3. (all ranks)   write the items of each own file (thread_count files in parallel),
//                    each item a complete torch.save blob, checksummed as it streams out.
//   4. (all ranks)   every rank learns whether any rank failed; if one did, every rank
//                    throws an error naming the failed ranks and nothing is committed.
//   5. (coordinator) gather the write results; write the checksum sidecar
//                    (kChecksumSidecar) and the load index (kIndexKey), then `.metadata`
//                    atomically (tmp + fsync + rename + directory fsync). `.metadata` is
//                    the commit marker: without it no reader sees a checkpoint.
//   6. (all ranks)   barrier: when save() returns on any rank the checkpoint is committed.
// Load:
//   1. (coordinator) read `.metadata`; broadcast the load index when it matches those
//                    bytes, else `.metadata` and the sidecar (PyTorch's checkpoints).
//   2. (all ranks)   plan: for every requested box, the overlapping saved chunks, and read
//                    only the byte ranges needed (never a whole blob for a slice), blobs
//                    in file order with read-ahead hints (ByteSource::will_need).
//   3. (all ranks)   copy into the caller's buffers; objects replace the template's leaves.
//   4. (all ranks, when verifying against a sidecar) exchange the crc32c of the pieces of
//                    checksum blocks each rank read only part of; each rank checks its
//                    blocks by combining the pieces (item_reader.cc).
//   5. (all ranks)   agree on success as in save step 4.
//
// Items: each is a complete torch.save blob (archive "archive"): a tensor chunk as
// _rebuild_tensor_v2 over a storage holding exactly the chunk's row-major bytes, a bytes
// item as torch.save of the object's pickle value. Blobs of one file follow each other
// without padding, bytes items first (item_writer.h). Checksums: checksum_sidecar.h.
//
// Load reads only what the plan needs: per saved blob its two ends (zip records and
// data.pkl; parsed unless the load index says where the data starts), then the needed
// byte runs of the tensor straight into the caller's buffer (item_reader.h). With
// verify_checksums nothing more: blocks a reshard cuts are checked from the pieces the
// ranks read (crc32c; an xxh3 sidecar, or a block no rank completes, has its missing part
// read).
//
// Failure: messages between ranks start with a RankStatus byte (plan_codec.h), so a
// failure on one rank turns into the same error on every rank without extra collectives:
// a step's expected status (kPlan, kWriteResult, kMetadata) + its body on success,
// kError + comm::encode_error(...) when this rank (or, from the coordinator, the job)
// failed.
#include "shardpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "engine/block_checksum.h"
#include "engine/checkpoint_index.h"
#include "engine/checksum_sidecar.h"
#include "engine/chunking.h"
#include "engine/flatten.h"
#include "engine/item_reader.h"
#include "engine/item_writer.h"
#include "engine/parallel_for.h"
#include "engine/plan_codec.h"
#include "engine/save_plan.h"
#include "engine/save_steps.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---------------------------------------------------------------------------------------
// Failures of several ranks as one error.

struct Failure {
  int rank = 0;
  std::string encoded;  // comm::encode_error form: "<category>\n<message>"
};

std::string message_of(const std::string& encoded) {
  const std::size_t nl = encoded.find('\n');
  return nl == std::string::npos ? encoded : encoded.substr(nl + 1);
}

// One encoded error (category of the lowest failed rank) whose message names every failed
// rank and its message: "save failed on rank 1 (of 4): rank 1: <message>".
std::string combine_failures(std::string_view op, const std::vector<Failure>& failures, int world) {
  std::string ranks;
  for (const Failure& f : failures) ranks += (ranks.empty() ? "" : ", ") + std::to_string(f.rank);
  std::string message = std::string(op) + " failed on rank" + (failures.size() > 1 ? "s " : " ") + ranks +
                        " (of " + std::to_string(world) + ")";
  for (const Failure& f : failures) message += (&f == &failures.front() ? ": rank " : "; rank ") +
                                               std::to_string(f.rank) + ": " + message_of(f.encoded);
  const std::string& first = failures.front().encoded;
  const std::size_t nl = first.find('\n');
  return (nl == std::string::npos ? std::string("error") : first.substr(0, nl)) + "\n" + message;
}

[[noreturn]] void throw_encoded(const std::string& encoded) { comm::throw_decoded_error(encoded, ""); }

std::string encode_current() { return comm::encode_error(std::current_exception()); }

// (all ranks) Throws the combined error on every rank when any rank passes an error.
void agree_or_throw(comm::Communicator& comm, std::exception_ptr local, std::string_view op) {
  std::vector<comm::RankError> errors = comm.all_errors(comm::encode_error(local));
  if (errors.empty()) return;
  std::vector<Failure> failures;
  for (auto& e : errors) failures.push_back({e.rank, std::move(e.message)});
  throw_encoded(combine_failures(op, failures, comm.world_size()));
}

std::string read_metadata_bytes(storage::Storage& st) {
  std::optional<std::string> bytes = st.try_read_all(kMetadataKey);
  if (!bytes) {
    throw StorageError(StorageError::Kind::kNotFound,
                       st.describe_key(kMetadataKey) + ": not a committed checkpoint (no .metadata)");
  }
  return std::move(*bytes);
}

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

// ---------------------------------------------------------------------------------------
// Load, steps 2-4 on one rank.

const format::ChunkStorageMetadata& find_chunk(const format::TensorStorageMetadata& tensor,
                                               const format::MetadataIndex& index) {
  if (index.index && *index.index >= 0 && static_cast<std::size_t>(*index.index) < tensor.chunks.size() &&
      tensor.chunks[static_cast<std::size_t>(*index.index)].offsets == index.offset) {
    return tensor.chunks[static_cast<std::size_t>(*index.index)];
  }
  for (const auto& chunk : tensor.chunks) {
    if (chunk.offsets == index.offset) return chunk;
  }
  throw FormatError(".metadata: tensor \"" + index.fqn + "\" has no chunk at offsets " +
                    shape_to_string(index.offset.value_or(Shape{})));
}

const format::StorageInfo& find_storage(const format::Metadata& metadata, const format::MetadataIndex& index,
                                        const std::string& metadata_name) {
  auto it = metadata.storage_data.find(format::MetadataIndex{index.fqn, index.offset, std::nullopt});
  if (it == metadata.storage_data.end()) {
    throw FormatError(metadata_name + ": item \"" + index.fqn + "\"" +
                      (index.offset ? " chunk at " + shape_to_string(*index.offset) : std::string()) +
                      ": expected a storage_data entry, found none");
  }
  return it->second;
}

// Announces (ByteSource::will_need) the byte ranges the reader threads will read, in the
// order they take their tasks, up to kReadAheadBytes ahead of the task being started: the
// device gets a deep queue of large reads whatever the thread count, and the readers'
// preads, headers included, find their pages in the cache or in flight.
class ReadAhead {
 public:
  struct Range {
    std::shared_ptr<const ByteSource> file;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  static constexpr std::uint64_t kReadAheadBytes = std::uint64_t{64} << 20;
  // Largest single hint, so the window advances smoothly.
  static constexpr std::uint64_t kHintBytes = std::uint64_t{8} << 20;

  // ranges_of_task[i]: what task i reads (file order within a task).
  explicit ReadAhead(std::vector<std::vector<Range>> ranges_of_task) {
    std::uint64_t total = 0;
    for (std::size_t t = 0; t < ranges_of_task.size(); ++t) {
      task_start_.push_back(total);
      for (Range& r : ranges_of_task[t]) {
        // Split large ranges so the window's leading edge moves in kHintBytes steps.
        for (std::uint64_t done = 0; done < r.length; done += kHintBytes) {
          const std::uint64_t n = std::min(kHintBytes, r.length - done);
          total += n;
          if (!hints_.empty() && hints_.back().file == r.file &&
              hints_.back().offset + hints_.back().length == r.offset + done &&
              hints_.back().length + n <= kHintBytes) {
            // Blobs follow each other in a file: one hint for many small ones (a
            // will_need costs a syscall even when the pages are cached).
            hints_.back().length += n;
            hint_end_.back() = total;
            continue;
          }
          hints_.push_back({r.file, r.offset + done, n});
          hint_end_.push_back(total);
        }
      }
    }
  }

  // Called by a reader as it starts task `task` (tasks start in increasing order).
  void starting(std::size_t task) {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another reader is advancing the window
    const std::uint64_t limit = (task < task_start_.size() ? task_start_[task] : 0) + kReadAheadBytes;
    while (next_ < hints_.size() && (next_ == 0 || hint_end_[next_ - 1] < limit)) {
      const Range& h = hints_[next_++];
      h.file->will_need(h.offset, h.length);
    }
  }

 private:
  std::vector<std::uint64_t> task_start_;  // bytes announced before task i's ranges
  std::vector<Range> hints_;
  std::vector<std::uint64_t> hint_end_;    // cumulative bytes through hint i
  std::mutex mu_;
  std::size_t next_ = 0;
};

// What the read phase leaves for the collective verification of partial blocks.
struct PendingChecks {
  std::optional<ChecksumSidecar> sidecar;
  std::vector<BlockPiece> pieces;
};

// Step 1's broadcast: the load index when it matches `.metadata` (checkpoints shardpoint
// wrote), else `.metadata` and, when verifying, the sidecar if there is one. Part 2 says
// whether the ranks verify (the coordinator decides, so all ranks agree on step 4).
constexpr std::string_view kFromIndex = "index";
constexpr std::string_view kFromPickle = "pickle";

std::string read_what_ranks_need(storage::Storage& checkpoint, const LoadOptions& options) {
  std::string metadata = read_metadata_bytes(checkpoint);
  if (std::optional<std::string> index = checkpoint.try_read_all(kIndexKey)) {
    if (index_matches(*index, as_bytes(metadata))) {
      return pack_parts({std::string(kFromIndex), std::move(*index), options.verify_checksums ? "1" : "0"});
    }
  }
  std::optional<std::string> sidecar;
  if (options.verify_checksums) sidecar = checkpoint.try_read_all(kChecksumSidecar);
  return pack_parts({std::string(kFromPickle), std::move(metadata), sidecar ? "1" : "0", sidecar.value_or(std::string())});
}

// What a rank plans from, decoded from that broadcast.
struct CheckpointFacts {
  format::Metadata metadata;
  // Where tensor data starts in each blob (from the index; empty otherwise).
  std::map<format::MetadataIndex, std::uint64_t> data_offsets;
  bool from_index = false;
};

CheckpointFacts decode_what_ranks_need(const std::vector<std::string>& parts, storage::Storage& checkpoint,
                                       std::optional<ChecksumSidecar>& sidecar) {
  CheckpointFacts facts;
  if (parts.size() == 3 && parts[0] == kFromIndex) {
    CheckpointIndex index = decode_checkpoint_index(parts[1], checkpoint.describe_key(kIndexKey));
    facts.metadata = std::move(index.metadata);
    facts.data_offsets = std::move(index.data_offsets);
    facts.from_index = true;
    if (parts[2] == "1") sidecar = std::move(index.checksums);
    return facts;
  }
  if (parts.size() != 4 || parts[0] != kFromPickle) throw FormatError("load: malformed metadata broadcast");
  facts.metadata = format::decode_metadata(as_bytes(parts[1]), checkpoint.describe_key(kMetadataKey));
  if (parts[2] == "1") {
    sidecar = ChecksumSidecar::decode(parts[3], checkpoint.describe_key(kChecksumSidecar));
  }
  return facts;
}

void load_on_rank(StateNode& state, const CheckpointFacts& facts, const std::string& metadata_name,
                  SourceCache& sources, const LoadOptions& options, LoadReport& report, PendingChecks& pending) {
  const format::Metadata& metadata = facts.metadata;
  const std::optional<ChecksumSidecar>& sidecar = pending.sidecar;

  // Tensor leaves are boxes with buffers, object leaves placeholders. 2.3-era keys: the
  // ≤2.3 flattening is used when it explains keys the 2.4 rule misses (DCP 2.5).
  const FlatStateDict flat = flatten_for_load(metadata, state);
  LoadPlanOptions plan_options;
  plan_options.strict = options.strict;
  const LoadPlan plan = make_load_plan(metadata, flat, plan_options);
  if (!options.strict) report.problems = plan.problems;

  // Group the reads by saved item: each blob is opened (its headers parsed) once.
  std::map<format::MetadataIndex, std::vector<const ReadItem*>> tensor_groups;
  std::vector<const ReadItem*> object_items;
  for (const ReadItem& item : plan.items) {
    if (item.type == ReadItemType::kTensor) {
      tensor_groups[format::MetadataIndex{item.storage_index.fqn, item.storage_index.offset, std::nullopt}].push_back(
          &item);
    } else {
      object_items.push_back(&item);
    }
  }
  // Blobs in file order (file, offset): the readers then move through each file front to
  // back, which is what read-ahead and the device do best with.
  struct Group {
    const std::vector<const ReadItem*>* items;
    const format::TensorStorageMetadata* tensor;
    const format::ChunkStorageMetadata* chunk;
    const format::StorageInfo* info;
  };
  std::vector<Group> groups;
  for (const auto& [key, items] : tensor_groups) {
    const auto& tensor = std::get<format::TensorStorageMetadata>(metadata.state_dict_metadata.at(key.fqn));
    groups.push_back({&items, &tensor, &find_chunk(tensor, items.front()->storage_index),
                      &find_storage(metadata, key, metadata_name)});
  }
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return std::tie(a.info->relative_path, a.info->offset) < std::tie(b.info->relative_path, b.info->offset);
  });

  auto checksums_for = [&](const format::StorageInfo& info) {
    BlobChecksums cs;
    if (sidecar) {
      cs.algorithm = sidecar->algorithm();
      cs.block_size = sidecar->block_size();
      cs.item = sidecar->find(info.relative_path, info.offset);
    }
    return cs;
  };

  const std::size_t tasks = groups.size() + object_items.size();
  std::vector<std::vector<ReadAhead::Range>> ranges(tasks);
  for (std::size_t t = 0; t < groups.size(); ++t) {
    const Group& g = groups[t];
    std::shared_ptr<const ByteSource> file = sources.get(g.info->relative_path);
    for (const ByteRange& r : SavedTensorBlob::needed_blob_ranges(
             *g.items, g.chunk->sizes, dtype_itemsize(g.tensor->properties.dtype), g.info->length)) {
      ranges[t].push_back({file, g.info->offset + r.offset, r.length});
    }
  }
  ReadAhead read_ahead(std::move(ranges));

  std::vector<ReadCounts> counts(tasks);
  std::vector<std::vector<BlockPiece>> pieces(tasks);
  std::vector<pickle::ValuePtr> objects(object_items.size());
  std::atomic<std::uint64_t> needed{0};

  parallel_for(tasks, static_cast<std::size_t>(std::max(options.thread_count, 1)), [&](std::size_t task) {
    read_ahead.starting(task);
    if (task < groups.size()) {
      const Group& g = groups[task];
      const format::MetadataIndex& key = g.items->front()->storage_index;
      auto data_offset = facts.data_offsets.find(key);  // ordering ignores the chunk position
      SavedTensorBlob blob(sources.get(g.info->relative_path), *g.info, key.fqn, *g.chunk, g.tensor->properties.dtype,
                           data_offset != facts.data_offsets.end() ? std::optional(data_offset->second) : std::nullopt);
      const BlobChecksums cs = checksums_for(*g.info);
      const std::size_t itemsize = dtype_itemsize(g.tensor->properties.dtype);
      for (const ReadItem* item : *g.items) {
        const auto& dest = std::get<TensorShard>(flat.items.at(item->dest_index.fqn));
        const std::uint64_t box_bytes = static_cast<std::uint64_t>(volume(dest.sizes)) * itemsize;
        if (dest.data.size() != box_bytes || (box_bytes > 0 && dest.data.data() == nullptr)) {
          throw UsageError("load: tensor \"" + item->dest_index.fqn + "\" box " +
                           box_to_string(dest.offsets, dest.sizes) + ": expected a buffer of " +
                           std::to_string(box_bytes) + " bytes, found " + std::to_string(dest.data.size()));
        }
        blob.read_into(*item, dest.data, dest.sizes, cs, &pieces[task]);
        needed += static_cast<std::uint64_t>(volume(item->lengths)) * itemsize;
      }
      counts[task] = blob.counts();
    } else {
      const std::size_t k = task - groups.size();
      const ReadItem& item = *object_items[k];
      const format::StorageInfo& info = find_storage(metadata, item.storage_index, metadata_name);
      std::shared_ptr<const ByteSource> file = sources.get(info.relative_path);
      objects[k] = read_saved_object(*file, info, item.storage_index.fqn, checksums_for(info), counts[task]);
      needed += info.length;
    }
  });

  // Objects replace the template's leaves (after all readers joined: the tree is not
  // thread-safe).
  for (std::size_t k = 0; k < object_items.size(); ++k) {
    const std::string& fqn = object_items[k]->dest_index.fqn;
    auto path = flat.planner_data.find(fqn);
    set_at_path(state, path != flat.planner_data.end() ? path->second : format::ObjectPath{fqn},
                StateNode(objects[k]));
  }
  for (auto& p : pieces) std::move(p.begin(), p.end(), std::back_inserter(pending.pieces));

  ReadCounts total;
  for (const ReadCounts& c : counts) total += c;
  report.bytes_needed = needed.load();
  report.data_bytes_read = total.data_bytes;
  report.bytes_read = total.data_bytes + total.header_bytes;
}

// (all ranks, when the broadcast carried a sidecar) Step 4: the ranks exchange the pieces
// of checksum blocks they read only part of, and each checks its blocks by combining the
// pieces of all ranks (item_reader.h). Returns this rank's error, if any.
std::exception_ptr verify_pieces_together(comm::Communicator& comm, std::exception_ptr read_error,
                                          PendingChecks& pending, SourceCache& sources, LoadReport& report) {
  std::vector<std::string> all =
      comm.all_gather(read_error ? encode_rank_message(RankStatus::kError)
                                 : encode_rank_message(RankStatus::kPlan, encode_block_pieces(pending.pieces)));
  if (read_error) return read_error;
  if (!pending.sidecar || pending.pieces.empty()) return nullptr;
  try {
    std::vector<BlockPiece> everyone;
    for (std::size_t r = 0; r < all.size(); ++r) {
      const RankMessage m = decode_rank_message(all[r]);
      if (m.status != RankStatus::kPlan) return nullptr;  // that rank failed; step 5 says so
      decode_block_pieces(m.body, "load: checksum pieces of rank " + std::to_string(r), everyone);
    }
    ReadCounts counts;
    verify_block_pieces(pending.pieces, everyone, *pending.sidecar,
                        [&](const std::string& file) { return sources.get(file); }, counts);
    report.data_bytes_read += counts.data_bytes;
    report.bytes_read += counts.data_bytes;
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Save steps (save_steps.h), shared by save() and async_save().

namespace save_steps {

void CommittedFiles::add(std::string key) {
  std::lock_guard lock(mu_);
  keys_.push_back(std::move(key));
}

void CommittedFiles::remove_all(storage::Storage& st) noexcept {
  std::lock_guard lock(mu_);
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
    std::vector<Failure> failures;
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
        plan_options.thread_count = options.thread_count;
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
  std::vector<std::vector<WrittenItem>> results(files.size());
  ItemWriteOptions item_options;
  item_options.checksum = options.checksum;
  item_options.block_size = options.checksum_block_bytes;
  storage::WriteOptions write_options;
  write_options.durable = options.durable;
  write_options.direct_io = options.direct_io;

  parallel_for(files.size(), static_cast<std::size_t>(std::max(options.thread_count, 1)), [&](std::size_t i) {
    const std::string& file = files[i].name;
    std::unique_ptr<storage::StorageWriter> writer = st.open_writer(file, write_options);
    for (const ItemToWrite& entry : files[i].items) {
      try {
        results[i].push_back(entry.value != nullptr ? write_item(*writer, file, *entry.item, *entry.value, item_options)
                                                    : write_serialized_item(*writer, file, entry.item->index,
                                                                            entry.serialized, item_options));
      } catch (const StorageError&) {
        rethrow_with_context("save: " + file + ": item \"" + entry.item->index.fqn + "\"");
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
  return encode_rank_message(RankStatus::kError, comm::encode_error(std::move(error)));
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
    if (checksummed) st.write_atomic(kChecksumSidecar, as_bytes(sidecar.encode()), wo);
    // Not durable on its own: an index a crash damages fails its checks and loads ignore
    // it, so it needs no fsync of its own (the `.metadata` commit below syncs the folder).
    if (metadata != nullptr) {
      storage::WriteOptions index_wo = wo;
      index_wo.durable = false;
      st.write_atomic(kIndexKey,
                      as_bytes(encode_checkpoint_index(*metadata, as_bytes(metadata_bytes),
                                                       checksummed ? &sidecar : nullptr, data_offsets)),
                      index_wo);
    }
    // The commit marker (tmp + fsync + rename + directory fsync when durable).
    st.write_atomic(kMetadataKey, as_bytes(metadata_bytes), wo);
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
      std::vector<Failure> failures;
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

  // 3. (all ranks) Write this rank's files, thread_count in parallel.
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

LoadReport load(StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm, const LoadOptions& options) {
  LoadReport report;
  const auto t0 = Clock::now();

  // 1. (coordinator) the load index, or `.metadata` and the sidecar, broadcast as bytes.
  std::string message;
  if (comm.is_coordinator()) {
    try {
      message = encode_rank_message(RankStatus::kMetadata, read_what_ranks_need(checkpoint, options));
    } catch (...) {
      message = encode_rank_message(RankStatus::kError, encode_current());
    }
  }
  message = comm.broadcast(std::move(message));
  const RankMessage broadcast = decode_rank_message(message);
  if (broadcast.status != RankStatus::kMetadata) {
    std::string encoded =
        message.empty() ? std::string("error\nempty metadata broadcast") : std::string(broadcast.body);
    throw_encoded(combine_failures("load", {{0, std::move(encoded)}}, comm.world_size()));
  }

  // 2-3. (all ranks) Plan and read.
  std::exception_ptr error;
  SourceCache sources(checkpoint);
  PendingChecks pending;
  bool verify_together = false;
  try {
    const std::vector<std::string> parts = unpack_parts(broadcast.body, "load: metadata broadcast");
    // Every rank got the same bytes, so all take part in step 4 or none does.
    verify_together = parts.size() >= 3 && parts[2] == "1";
    const CheckpointFacts facts = decode_what_ranks_need(parts, checkpoint, pending.sidecar);
    report.used_index = facts.from_index;
    load_on_rank(state, facts, checkpoint.describe_key(kMetadataKey), sources, options, report, pending);
  } catch (...) {
    error = std::current_exception();
  }
  // 4. (all ranks) Blocks read in pieces by several ranks, verified together.
  if (verify_together) error = verify_pieces_together(comm, error, pending, sources, report);
  // 5. (all ranks) Agree.
  agree_or_throw(comm, error, "load");
  report.seconds = seconds_since(t0);
  return report;
}

format::Metadata read_metadata(storage::Storage& checkpoint) {
  const std::string bytes = read_metadata_bytes(checkpoint);
  return format::decode_metadata(as_bytes(bytes), checkpoint.describe_key(kMetadataKey));
}

}  // namespace shardpoint::engine
