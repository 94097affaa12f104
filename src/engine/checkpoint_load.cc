// load(): the executor of load plans (save() is in checkpoint.cc).
//
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
// Load reads only what the plan needs: per saved blob its two ends (zip records and
// data.pkl; parsed unless the load index says where the data starts), then the needed
// byte runs of the tensor straight into the caller's buffer (item_reader.h). With
// verify_checksums nothing more: blocks a reshard cuts are checked from the pieces the
// ranks read (crc32c; an xxh3 sidecar, or a block no rank completes, has its missing part
// read). A blob without a sidecar entry has the zip CRC-32s of its records checked instead,
// over the same reads (zip_crc_ledger.h); no extra bytes are read for it, and a record this
// rank reads only part of stays unchecked (LoadReport::zip_crc.records_partial).
//
// Failure: as for save (checkpoint.cc), messages between ranks start with a RankStatus
// byte (plan_codec.h); rank_failures.h makes one error of the failures of several ranks.
#include "shardpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

#include "engine/block_checksum.h"
#include "engine/block_pieces.h"
#include "engine/checkpoint_index.h"
#include "engine/checksum_sidecar.h"
#include "engine/chunking.h"
#include "engine/flatten.h"
#include "engine/folder_metadata.h"
#include "engine/item_reader.h"
#include "engine/metadata_files.h"
#include "engine/parallel_for.h"
#include "engine/plan_codec.h"
#include "engine/rank_failures.h"
#include "engine/read_ahead.h"
#include "engine/safetensors_metadata.h"
#include "engine/save_steps.h"
#include "engine/saved_object.h"
#include "engine/zip_crc_ledger.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

using Clock = std::chrono::steady_clock;

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

// What the read phase leaves for the collective verification of partial blocks.
struct PendingChecks {
  std::optional<ChecksumSidecar> sidecar;
  std::vector<BlockPiece> pieces;
};

// Step 1's broadcast: the load index when it matches `.metadata` (checkpoints shardpoint
// wrote), else `.metadata` and, when verifying, the sidecar if there is one. Part 2 says
// whether the ranks verify (the coordinator decides, so all ranks agree on step 4).
// A folder without `.metadata` (Hugging Face safetensors) sends the Metadata its headers
// give, encoded as `.metadata` (safetensors_metadata.h).
constexpr std::string_view kFromIndex = "index";
constexpr std::string_view kFromPickle = "pickle";
constexpr std::string_view kFromSafetensors = "safetensors";

std::string read_what_ranks_need(storage::Storage& checkpoint, const LoadOptions& options) {
  // `.metadata`, or the union of the per-rank files (metadata_files.h).
  std::optional<std::string> bytes = try_read_checkpoint_metadata(checkpoint);
  if (!bytes) {
    FolderMetadata folder = read_folder_metadata(checkpoint);  // throws "no .metadata" when not HF
    return pack_parts({std::string(kFromSafetensors), format::encode_metadata(folder.metadata)});
  }
  std::string metadata = std::move(*bytes);
  if (std::optional<std::string> index = checkpoint.try_read_all(kIndexKey)) {
    if (index_matches(*index, as_bytes(metadata))) {
      return pack_parts({std::string(kFromIndex), std::move(*index), options.verify_checksums ? "1" : "0"});
    }
  }
  std::optional<std::string> sidecar;
  if (options.verify_checksums) sidecar = checkpoint.try_read_all(kChecksumSidecar);
  return pack_parts(
      {std::string(kFromPickle), std::move(metadata), sidecar ? "1" : "0", sidecar.value_or(std::string())});
}

// What a rank plans from, decoded from that broadcast.
struct CheckpointFacts {
  format::Metadata metadata;
  // Where tensor data starts in each blob (from the index; empty otherwise).
  std::map<format::MetadataIndex, std::uint64_t> data_offsets;
  bool from_index = false;
  // Tensor items are raw safetensors bytes (folder_metadata.h): read at blob offset 0.
  bool raw_tensor_items = false;
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
  if (parts.size() == 2 && parts[0] == kFromSafetensors) {
    facts.metadata = format::decode_metadata(as_bytes(parts[1]), checkpoint.describe_key(kHfIndexKey));
    facts.raw_tensor_items = true;
    return facts;
  }
  if (parts.size() != 4 || parts[0] != kFromPickle) throw FormatError("load: malformed metadata broadcast");
  facts.metadata = format::decode_metadata(as_bytes(parts[1]), checkpoint.describe_key(kMetadataKey));
  facts.raw_tensor_items = resolve_safetensors_items(facts.metadata, checkpoint);
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

  ZipCrcLedger zip_crc;
  const bool check_zip = options.verify_checksums && options.check_zip_crc;
  auto checksums_for = [&](const format::StorageInfo& info) {
    BlobChecksums cs;
    if (sidecar) {
      cs.algorithm = sidecar->algorithm();
      cs.block_size = sidecar->block_size();
      cs.item = sidecar->find(info.relative_path, info.offset);
    }
    if (cs.item == nullptr && check_zip) cs.zip_crc = &zip_crc;
    return cs;
  };

  // Task t < groups.size() reads groups[t], the others object_items[t - groups.size()]; they
  // run in file order, objects among the blobs: another rank's objects and small tensors
  // sit together at the start of its file (save_plan.h), and are then read in one pass.
  const std::size_t tasks = groups.size() + object_items.size();
  std::vector<const format::StorageInfo*> task_info(tasks);
  for (std::size_t t = 0; t < groups.size(); ++t) task_info[t] = groups[t].info;
  for (std::size_t k = 0; k < object_items.size(); ++k) {
    task_info[groups.size() + k] = &find_storage(metadata, object_items[k]->storage_index, metadata_name);
  }
  std::vector<std::size_t> order(tasks);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(task_info[a]->relative_path, task_info[a]->offset) <
           std::tie(task_info[b]->relative_path, task_info[b]->offset);
  });
  std::vector<std::vector<ByteRange>> task_ranges(tasks);  // by position in `order`, in the file
  for (std::size_t i = 0; i < tasks; ++i) {
    const std::size_t t = order[i];
    const format::StorageInfo& info = *task_info[t];
    if (t >= groups.size() || !info.transform_descriptors.empty()) {
      // Objects and zstd items are read whole (announced too: object stores size their GETs
      // by it).
      task_ranges[i].push_back({info.offset, info.length});
      continue;
    }
    const Group& g = groups[t];
    for (const ByteRange& r : SavedTensorBlob::needed_blob_ranges(
             *g.items, g.chunk->sizes, dtype_itemsize(g.tensor->properties.dtype), info.length)) {
      task_ranges[i].push_back({info.offset + r.offset, r.length});
    }
  }
  // Every file opened at once, each told how far its first run of needed bytes goes: on an
  // object store the request that opens a file then brings those bytes too (another rank's
  // first file: its small items; this rank's files: their first window).
  FirstReads first_reads;
  for (std::size_t i = 0; i < tasks; ++i) {
    for (const ByteRange& r : task_ranges[i]) first_reads.add(task_info[order[i]]->relative_path, r.offset, r.length);
  }
  sources.open_all(first_reads.files(), static_cast<std::size_t>(std::max(options.thread_count, 1)));
  std::vector<std::vector<ReadAhead::Range>> ranges(tasks);
  for (std::size_t i = 0; i < tasks; ++i) {
    std::shared_ptr<const ByteSource> file = sources.get(task_info[order[i]]->relative_path);
    for (const ByteRange& r : task_ranges[i]) ranges[i].push_back({file, r.offset, r.length});
  }
  ReadAhead read_ahead(std::move(ranges));

  std::vector<ReadCounts> counts(tasks);
  std::vector<std::vector<BlockPiece>> pieces(tasks);
  std::vector<pickle::ValuePtr> objects(object_items.size());
  std::atomic<std::uint64_t> needed{0};

  parallel_for(tasks, static_cast<std::size_t>(std::max(options.thread_count, 1)), [&](std::size_t position) {
    read_ahead.starting(position);
    const std::size_t task = order[position];
    if (task < groups.size()) {
      const Group& g = groups[task];
      const format::MetadataIndex& key = g.items->front()->storage_index;
      const BlobChecksums cs = checksums_for(*g.info);
      // The zip CRC-32s are in the blob's central directory: a blob checked by them is parsed.
      auto data_offset = cs.zip_crc != nullptr ? facts.data_offsets.end()
                                               : facts.data_offsets.find(key);  // ordering ignores the chunk position
      std::optional<std::uint64_t> data_start;
      if (facts.raw_tensor_items) {
        data_start = 0;
      } else if (data_offset != facts.data_offsets.end()) {
        data_start = data_offset->second;
      }
      SavedTensorBlob blob(sources.get(g.info->relative_path), *g.info, key.fqn, *g.chunk, g.tensor->properties.dtype,
                           data_start, /*defer_transformed=*/true);
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
      const format::StorageInfo& info = *task_info[task];
      std::shared_ptr<const ByteSource> file = sources.get(info.relative_path);
      objects[k] = read_saved_object(file, info, item.storage_index.fqn, checksums_for(info), counts[task]);
      needed += info.length;
    }
  });

  // Objects replace the template's leaves (after all readers joined: the tree is not
  // thread-safe).
  for (std::size_t k = 0; k < object_items.size(); ++k) {
    const std::string& fqn = object_items[k]->dest_index.fqn;
    auto path = flat.planner_data.find(fqn);
    set_at_path(state, path != flat.planner_data.end() ? path->second : format::ObjectPath{fqn}, StateNode(objects[k]));
  }
  for (auto& p : pieces) std::move(p.begin(), p.end(), std::back_inserter(pending.pieces));

  ReadCounts total;
  for (const ReadCounts& c : counts) total += c;
  report.bytes_needed = needed.load();
  report.zip_crc = zip_crc.counts();
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
    verify_block_pieces(
        pending.pieces, everyone, *pending.sidecar, [&](const std::string& file) { return sources.get(file); }, counts);
    report.data_bytes_read += counts.data_bytes;
    report.bytes_read += counts.data_bytes;
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

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
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

format::Metadata read_metadata(storage::Storage& checkpoint) { return read_folder_metadata(checkpoint).metadata; }

}  // namespace shardpoint::engine
