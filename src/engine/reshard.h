// reshard(): rewrites a checkpoint (a DCP folder, or a torch.save file) as a DCP checkpoint
// laid out as a job of N ranks would save it with dim-0 sharding: every tensor with
// dimensions is split on dim 0 as DTensor's Shard(0) on a 1-D mesh of N does (ceil
// division; the last ranks may get empty boxes), 0-dim tensors and replicated-looking
// tensors are written whole once, objects are kept. With ranks = 1 and a torch.save
// source it is the torch.save -> DCP conversion.
//
// How (steps run in this process; the N ranks are threads of a comm::ThreadGroup):
//   1. Open the source and list its leaves in DCP flattening order (engine/flatten.h,
//      PyTorch >= 2.4 rule) with their planner_data paths. A DCP source keeps its paths.
//   2. Read every object (small) and every replicated-looking tensor once; all ranks
//      share those buffers.
//   3. (each rank thread) Fill its own boxes from the source, then engine::save() the
//      tree into the destination. save() publishes `.metadata` last (commit marker), so
//      a failed reshard leaves no checkpoint behind.
//
// Replicated-looking: in a DCP source whose tensors were sharded (some tensor has more than
// one saved chunk), a tensor with dimensions stored as exactly one chunk covering it
// whole: what DCP writes for a plain (replicated) tensor. In a torch.save source nothing
// is replicated-looking: every tensor with dimensions is sharded.
//
// Memory: every rank holds its boxes until save() returns, so the whole payload is in
// memory at once (payload / N per rank) for a DCP source. Peak RSS is about twice the
// payload then, because the source files CheckpointReader maps count too (page cache, not
// copies; measured: 0.73 GB checkpoint 4 -> 3 ranks, max RSS 1.50 GiB). For a torch.save source whose
// tensors are contiguous and little-endian, boxes alias the mapped file instead (page
// cache, no copy); other tensors (strided views, big-endian files) are copied. A later
// version can write items one by one from the source through the planner (TODO(reshard):
// stream through save_plan + item_writer to bound memory by the buffer pool).
//
// Thread-safety: reshard() calls may run concurrently on different destinations.
#pragma once

#include <cstdint>
#include <string>

#include "engine/checkpoint.h"
#include "storage/storage.h"

namespace shardpoint::engine {

struct ReshardOptions {
  // Ranks of the job to imitate (files __0_0.distcp .. __{N-1}_0.distcp). REQUIRES >= 1.
  int ranks = 1;
  // Verify the source's sidecar checksums while reading (DCP sources that have one).
  bool verify_checksums = true;
  // Passed to every rank's save() (checksums, durability, O_DIRECT, threads per rank).
  SaveOptions save;
};

struct ReshardReport {
  std::string source_format;       // "dcp" or "torch"
  std::uint64_t tensors = 0;       // tensor leaves written
  std::uint64_t objects = 0;       // object leaves written
  std::uint64_t payload_bytes = 0; // tensor bytes (each tensor once)
  std::uint64_t copied_bytes = 0;  // bytes copied into memory for the ranks' boxes
  std::uint64_t bytes_written = 0; // all ranks, blobs with headers
  double seconds = 0;              // the whole call
};

// Rewrites the checkpoint at `source` (a path: a folder is read as DCP, a file as
// torch.save) into `destination`, which must be empty. Blocks until the checkpoint is
// committed. Throws UsageError for ranks < 1 or a non-empty destination; FormatError /
// StorageError / PlanError from reading the source (naming file and fqn), or when a
// torch.save source's root is not a mapping; whatever save() throws. On failure nothing
// is committed (no `.metadata`).
ReshardReport reshard(const std::string& source, storage::Storage& destination, const ReshardOptions& options);

}  // namespace shardpoint::engine
