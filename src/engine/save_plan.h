// Save planning: what each rank writes, into which file, and the checkpoint's Metadata
// skeleton (docs/dcp-format.md §1.2-1.3, §4.2-4.3).
//
// Steps (DCP's planner.py split, with no I/O and no communicator here):
//   1. (all ranks)   make_local_save_plan: one WriteItem per flattened leaf, bytes items and
//                    replicated tensors included, as DCP >= 2.4 does.
//   2. (coordinator) make_global_save_plan over the gathered local plans: check that ranks
//                    agree, deduplicate identical MetadataIndexes (dedup_save_plans),
//                    build the Metadata skeleton, validate the chunks, assign files
//                    __{rank}_{n}.distcp and each item's position in its file.
//   3. (engine)      scatter the final plans; the executor writes each file's items in
//                    index_in_file order (bytes items, small tensors, the rest: see
//                    SavePlanOptions::small_item_bytes) and fills Metadata::storage_data with the offsets
//                    and lengths it wrote (the plan does not know blob sizes).
//
// Plan items are values: planners take them by const reference or by value and return
// new ones; nothing is changed in place behind the caller. Deterministic: the same inputs
// give the same plans (items sorted by fqn, then chunk offsets). Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/flatten.h"
#include "shardpoint/dtype.h"
#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

enum class WriteItemType {
  kTensor,  // DCP's TENSOR and SHARD: one chunk of a tensor, written as a torch.save blob
  kBytes,   // DCP's BYTE_IO: one pickled object
};

struct WriteItem {
  // fqn and, for tensors, the chunk's offsets. index.index is the chunk's position in
  // TensorStorageMetadata::chunks once the global plan is made (empty in a local plan).
  format::MetadataIndex index;
  WriteItemType type = WriteItemType::kTensor;

  // kTensor only.
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  Shape global_size;                   // empty for a 0-dim tensor
  format::ChunkStorageMetadata chunk;  // global coordinates; offsets == *index.offset
  std::uint64_t nbytes = 0;            // raw data bytes: volume(chunk.sizes) * itemsize

  // kBytes only: the serialized size when known before writing (balances dedup).
  std::optional<std::uint64_t> bytes_size;

  // Set by make_global_save_plan: the file ("__3_0.distcp") and the item's position among
  // that file's items, i.e. the order the executor writes them in.
  std::string file;
  std::int64_t index_in_file = -1;

  // The weight dedup and bucket balancing use: nbytes for tensors, bytes_size for bytes
  // items, and at least 1 (DCP counts objects and empty chunks as 1).
  std::uint64_t storage_size() const;

  // All fields, including index.index (MetadataIndex's own == ignores it).
  bool operator==(const WriteItem& other) const;
  // e.g. tensor "w" [0:4, 0:3] of float32[8, 3] (48 B) -> __0_0.distcp#1
  std::string to_string() const;
};

struct SavePlan {
  int rank = 0;  // group rank: the R of __R_N.distcp and this plan's position in the gather
  std::vector<WriteItem> items;
  // fqn -> path in the nested state dict (this rank's leaves).
  std::map<std::string, format::ObjectPath> planner_data;
  // Final plans only: every file this rank creates, in N order. A bucket without items
  // is still listed: DCP creates thread_count files per rank, empty ones included.
  std::vector<std::string> files;

  bool operator==(const SavePlan&) const = default;
  std::string to_string() const;  // one line per item
};

struct SavePlanOptions {
  // Files (and writer threads) per rank when single_file_per_rank. With more than one,
  // bytes items and small tensors (up to 4 MiB of them) go to the first file, and the other
  // tensors, largest first, to the file with the fewest tensor bytes so far
  // (split_into_files). REQUIRES >= 1.
  int thread_count = 1;
  // false: one file per item (DCP 1.13's default), N = the item's position in the plan.
  bool single_file_per_rank = true;
  // true: every duplicated item is written by the lowest rank that has it (DCP's
  // dedup_save_to_lowest_rank). false (default): by the candidate rank with the smallest
  // accumulated storage_size so far, which spreads replicated data over ranks.
  bool dedup_to_lowest_rank = false;
  // Tensor chunks of fewer raw bytes go to a rank's first file with its bytes items (up to
  // 4 MiB of them), written together after them and before its larger tensors, so a reader
  // that needs only the small items of a rank (the replicated ones dedup left there) opens
  // one of its files and reads one byte run. 0: no small tensors (bytes items still first). The default takes in 1-D
  // shards (biases, norms, 0-dim Adam steps) and keeps the run well below an object-store read window (8 MiB).
  std::uint64_t small_item_bytes = std::uint64_t{64} << 10;
};

struct GlobalSavePlan {
  std::vector<SavePlan> plans;  // final plan of every rank, by rank
  // state_dict_metadata (chunks sorted by offsets) and merged planner_data; storage_data
  // stays empty until the executor reports offsets and lengths.
  format::Metadata metadata;
};

// Step 1. One item per leaf of `flat`, in fqn order: a tensor shard -> kTensor item for
// its box; an object -> kBytes item (size unknown).
// Throws UsageError naming the fqn when a shard is inconsistent: offsets/sizes/global
// shape of different lengths, negative values, a box outside the global shape, or a
// non-null data span whose size is not volume * itemsize (a null span is allowed:
// planning never reads data).
SavePlan make_local_save_plan(const FlatStateDict& flat, int rank);

// Step 2. REQUIRES local_plans[i].rank == i (UsageError otherwise).
// Throws PlanError, one message listing every problem, when ranks disagree on an fqn
// (tensor vs bytes, dtype, global size, sizes of the chunk at one offset, planner_data
// path; the message names the fqn and the ranks) or when the deduplicated chunks of a
// tensor are invalid (outside the global size, overlapping, or not covering it; the
// coverage test is skipped for 0-dim tensors).
// Throws UsageError when options.thread_count < 1.
GlobalSavePlan make_global_save_plan(std::vector<SavePlan> local_plans, const SavePlanOptions& options = {});

// Where each item of a final `plan` lands when its blob is blob_lengths[i] bytes long
// (i = position in plan.items): a file is its items' blobs concatenated in index_in_file
// order, no header, no padding (docs/dcp-format.md §2.1). The result is this rank's part of
// Metadata::storage_data. Use it when blob sizes are known before writing (to write at
// precomputed offsets), or after writing with the lengths actually written.
// Throws UsageError when blob_lengths.size() != plan.items.size() or an item has no file.
std::map<format::MetadataIndex, format::StorageInfo> storage_layout(const SavePlan& plan,
                                                                    std::span<const std::uint64_t> blob_lengths);

// An item as the split into files sees it.
struct ItemWeight {
  WriteItemType type = WriteItemType::kTensor;
  std::uint64_t nbytes = 0;  // tensors: the chunk's raw bytes; bytes items: not counted
};

// Step 2's split of one rank's items into data files (the rule make_global_save_plan
// applies, exposed for plans made elsewhere: PyTorch DCP's through the C API): positions in
// `items`, per file N (__R_N.distcp), each file in the order its items are written.
// single_file_per_rank: options.thread_count files (trailing ones empty when there are
// fewer items; a file with items never follows an empty one); bytes items, and tensors
// under small_item_bytes up to 4 MiB of them, in the first file, then the other tensors
// largest first onto the file with the fewest tensor bytes; in a file bytes items, then
// tensors under small_item_bytes, then the rest. Otherwise one file per item, in order. Throws UsageError when
// options.thread_count < 1. Pure.
std::vector<std::vector<std::size_t>> split_into_files(std::span<const ItemWeight> items,
                                                       const SavePlanOptions& options);

// Files (and writer threads) per rank when a save asks for thread_count of them
// (SaveOptions::thread_count): thread_count, raised to kObjectStoreFilesPerRank on an object
// store (features.object_store), where one object per rank would be one stream per rank for
// the upload (one request at a time on GCS's sessions) and for the load's ranged GETs. Pure.
// 4: on moto, 4 Python ranks, 0.34 GB: save 0.14-0.15 GB/s, load 0.33-0.46 (1 object: 0.09-0.13, 0.15).
inline constexpr int kObjectStoreFilesPerRank = 4;
int files_per_rank(int thread_count, const storage::StorageFeatures& features);

}  // namespace shardpoint::engine
