// reshard(): rewrites a checkpoint (a DCP folder, or a torch.save file) as a DCP checkpoint
// laid out as a job of N ranks would save it with dim-0 sharding: every tensor with
// dimensions is split on dim 0 as DTensor's Shard(0) on a 1-D mesh of N does (ceil
// division; the last ranks may get empty boxes), 0-dim tensors and replicated-looking
// tensors are written whole once, objects are kept (an object that holds tensors with its
// storages, as torch.save writes it: docs/dcp-format.md §2.5). With ranks = 1 and a
// torch.save source it is the torch.save -> DCP conversion.
//
// Sources: a local DCP folder or torch.save file, or a storage URL (s3://, gs://, az://,
// abfs://, file://, memory://; storage_registry.h). A URL names a DCP checkpoint when
// `<url>/.metadata` exists; otherwise, when its last segment names an object, that object
// is read as a torch.save file (ranged reads: only its headers, data.pkl and tensor bytes
// are fetched); otherwise it is "not a committed checkpoint".
//
// How (one process, no communicator; the output is byte for byte what N ranks calling
// engine::save() on the same boxes would write, see tests/cli/reshard_test.cc):
//   1. Open the source and list its leaves in DCP flattening order (engine/flatten.h,
//      PyTorch >= 2.4 rule) with their planner_data paths. A DCP source keeps its paths.
//      Objects are read now (small); tensor data is not.
//   2. Plan as save() does: each rank's flattened leaves (tensor shards without data) ->
//      make_local_save_plan -> make_global_save_plan (dedup, files __{r}_{n}.distcp).
//   3. Write every rank's files, `parallel_files` at a time. Each item is streamed into its
//      file through write_tensor_item(): its box is read from the source in slabs of at
//      most memory_budget_bytes / parallel_files (CheckpointReader::read_box for DCP,
//      pread / ranged reads for torch.save) and appended as it is read.
//   4. Commit with save()'s commit step (save_steps::commit_checkpoint): the checksum
//      sidecar, then `.metadata` in one atomic write (the commit marker), so a failed
//      reshard leaves no checkpoint behind; the sidecar and the files already written are
//      removed (best effort).
//   5. A DCP source with Lightning's meta.pt (a Lightning sharded checkpoint, FSDPStrategy's
//      "model" or ModelParallelStrategy's "state_dict" layout alike): its bytes, read and
//      checked by their zip CRC-32s before step 2 (with verify_checksums and
//      check_zip_crc), are published unchanged after `.metadata`, Lightning's order, so
//      Lightning resumes from the output at any world size. When that write fails,
//      `.metadata` is removed again with the rest.
//
// Replicated-looking: in a DCP source whose tensors were sharded (some tensor has more than
// one saved chunk), a tensor with dimensions stored as exactly one chunk covering it
// whole: what DCP writes for a plain (replicated) tensor. In a torch.save source nothing
// is replicated-looking: every tensor with dimensions is sharded.
//
// Memory: bounded by the options, whatever the checkpoint size: memory_budget_bytes of
// slabs, plus the destination driver's staging buffers (StorageOptions: 64 MiB by default;
// object stores also hold their multipart part buffers, S3: 4 x 8 MiB per writer), plus an
// object-store source's read cache (S3: 64 MiB for all its open files together, plus a
// window per reader thread that misses when that is full), plus the objects (a
// DCP object item that holds tensors: its whole item, storages included) and the metadata.
// Sources are read with pread / ranged GETs, never mapped, so source pages do not count in
// the RSS (a 1.41 GB file -> 4 ranks: 234 MiB peak with the default 256 MiB budget).
//
// Thread-safety: reshard() calls may run concurrently on different destinations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardpoint/checkpoint.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"
#include "shardpoint/zip_crc_counts.h"

namespace shardpoint::engine {

struct ReshardOptions {
  // Ranks of the job to imitate (files __0_0.distcp .. __{N-1}_0.distcp). REQUIRES >= 1.
  int ranks = 1;
  // Verify the source's sidecar checksums while reading (DCP sources that have one).
  bool verify_checksums = true;
  // Check the zip CRC-32 of every record read whole where no sidecar covers it: the blobs
  // of a DCP source without a sidecar (checkpoint_reader.h), every record of a torch.save
  // source (engine/torch_file_crc.h). A record read only in part (a view of part of its
  // storage) is counted in ReshardReport::zip_crc.records_partial, not checked. A mismatch
  // fails the reshard (FormatError naming file, record, fqn and byte range) before
  // anything is committed. Applies only with verify_checksums.
  bool check_zip_crc = true;
  // As for save(): checksums, durability, O_DIRECT, dedup; thread_count = files per rank
  // (raised to 4 on object stores, as save() does).
  SaveOptions save;
  // Bytes of tensor data read from the source and held at once (the slabs of the files
  // being written). Smaller budgets mean more, smaller reads. REQUIRES > 0.
  std::uint64_t memory_budget_bytes = std::uint64_t{256} << 20;
  // Files written at once; 0: min(4, all files). Each holds one slab.
  int parallel_files = 0;
};

struct ReshardReport {
  CheckpointKind source_format = CheckpointKind::kDcp;  // what `source` held
  std::uint64_t tensors = 0;                            // tensor leaves written
  std::uint64_t objects = 0;                            // object leaves written
  std::uint64_t payload_bytes = 0;                      // tensor bytes (each tensor once)
  std::uint64_t copied_bytes = 0;                       // tensor bytes read from the source (slabs)
  std::uint64_t slab_bytes = 0;                         // largest slab of one file writer
  std::uint64_t bytes_written = 0;                      // all ranks, blobs with headers
  ZipCrcCounts zip_crc;             // zip CRC-32 checks of records no sidecar covers (check_zip_crc), meta.pt's too
  std::uint64_t meta_pt_bytes = 0;  // Lightning's meta.pt carried over (0: the source has none)
  double seconds = 0;               // the whole call
};

// Rewrites the checkpoint at `source` (a path or URL, see the top of this file) into
// `destination`, which must be empty. Blocks until the checkpoint is committed. Throws
// UsageError for ranks < 1, a zero budget or a non-empty destination; FormatError /
// StorageError / PlanError from reading the source (naming file and fqn), or when a
// torch.save source's root is not a mapping; StorageError from writing. On failure nothing
// is committed (no `.metadata`) and the files written are removed (best effort).
ReshardReport reshard(const Location& source, storage::Storage& destination, const ReshardOptions& options);
// Location::parse(source), then the above.
ReshardReport reshard(const std::string& source, storage::Storage& destination, const ReshardOptions& options);

}  // namespace shardpoint::engine
