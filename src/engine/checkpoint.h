// save() and load(): sharded checkpoints in PyTorch's DCP format, SPMD (every rank of the
// communicator calls them with its own part of the state).
//
// Save (docs/dcp-format.md §1-§4; shared/docs/DESIGN.md "Data flow"):
//   1. (all ranks)   flatten the state, make the local plan.
//   2. (coordinator) gather the plans, deduplicate replicated items, assign files
//                    __{rank}_{n}.distcp, scatter the final plans.
//   3. (all ranks)   write the items of each own file (thread_count files in parallel),
//                    each item a complete torch.save blob, checksummed as it streams out.
//   4. (all ranks)   every rank learns whether any rank failed; if one did, every rank
//                    throws an error naming the failed ranks and nothing is committed.
//   5. (coordinator) gather the write results; write the checksum sidecar
//                    (kChecksumSidecar) and the load index (kIndexKey), then `.metadata`
//                    atomically (tmp + fsync + rename + directory fsync). `.metadata` is the commit marker: without it no
//                    reader (PyTorch's or ours) sees a checkpoint.
//   6. (all ranks)   barrier: when save() returns on any rank the checkpoint is committed.
// Load:
//   1. (coordinator) read `.metadata`; broadcast the load index when it matches those
//                    bytes, else `.metadata` and the sidecar (PyTorch's checkpoints).
//   2. (all ranks)   plan: for every requested box, the overlapping saved chunks, and read
//                    only the byte ranges needed (never a whole blob for a slice), blobs
//                    in file order with read-ahead hints (WILLNEED) 64 MiB ahead.
//   3. (all ranks)   copy into the caller's buffers; objects replace the template's leaves.
//   4. (all ranks, when verifying against a sidecar) exchange the crc32c of the pieces of
//                    checksum blocks each rank read only part of; each rank checks its
//                    blocks by combining the pieces (item_reader.h).
//   5. (all ranks)   agree on success as in save step 4.
//
// Failure (save and load): every rank passes its outcome to the others inside the messages
// of the steps above (a status letter before each plan / result), so when any rank fails in
// any step every rank throws one error of the lowest failed rank's category whose message
// names all failed ranks and their messages: "save failed on ranks 1, 3 (of 4): rank 1:
// <message>; rank 3: <message>". A failed save never writes `.metadata`; each rank removes
// the files it already committed in this attempt (best effort) and the coordinator the
// sidecar. Saving into a folder that holds a committed checkpoint first removes its
// `.metadata` and sidecar (its data files are about to be overwritten); other folders are
// never touched. A rank that dies makes the others fail with the communicator's CommError
// (after its timeout) and remove their files the same way.
//
// Items: each is a complete torch.save blob (archive "archive"): a tensor chunk as
// _rebuild_tensor_v2 over a storage holding exactly the chunk's row-major bytes, a bytes
// item as torch.save of the object's pickle value. Blobs of one file follow each other
// without padding, bytes items first (item_writer.h). Checksums: checksum_sidecar.h.
//
// Load reads only what the plan needs: per saved blob its two ends (zip records and
// data.pkl, 512 + 1024 bytes; parsed unless the load index says where the data starts),
// then the needed byte runs of the tensor straight into the caller's buffer
// (item_reader.h). With verify_checksums nothing more: blocks a reshard
// cuts are checked from the pieces the ranks read (crc32c; an xxh3 sidecar, or a block
// no rank completes, has its missing part read).
//
// Thread-safety: one save()/load() per communicator at a time. Blocking. load() fills the
// caller's buffers from up to LoadOptions::thread_count threads and writes object leaves
// from the calling thread; on failure the state may be partly filled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/load_plan.h"
#include "engine/state_dict.h"
#include "format/metadata.h"
#include "storage/storage.h"

namespace shardpoint::engine {

// The index of a DCP checkpoint; its presence commits the checkpoint (docs/dcp-format.md).
inline constexpr const char* kMetadataKey = ".metadata";

// Name of the checksum sidecar in a checkpoint folder (format: checksum_sidecar.h).
// PyTorch ignores it. Written only when SaveOptions::checksum is not kNone.
inline constexpr const char* kChecksumSidecar = ".shardpoint-checksums.json";
// Name of the load index (format: checkpoint_index.h): `.metadata`, the checksums and where
// each tensor blob's data starts, in a binary form every rank of a load decodes quickly.
// PyTorch ignores it; a load uses it only when it matches the `.metadata` it read.
inline constexpr const char* kIndexKey = ".shardpoint-index";

// Persisted in the sidecar by name ("crc32c", "xxh3"); existing names must never change.
enum class ChecksumAlgorithm { kNone, kCrc32c, kXxh3 };

struct SaveOptions {
  // --- behaviour ---
  // Per-item checksums kept in the sidecar and verified on load.
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kCrc32c;
  // Bytes per checksum block (sidecar "block_size"). A verified ranged read is widened to
  // the blocks it touches, so smaller blocks waste less read bandwidth on resharding loads
  // but grow the sidecar (8 or 16 hex digits per block). REQUIRES > 0.
  std::uint64_t checksum_block_bytes = std::uint64_t{1} << 20;
  // fsync every file and the folder before `.metadata` is published. Turn off only for
  // benchmarks: after a crash a checkpoint may then look complete when it is not.
  bool durable = true;
  // Write each duplicated (replicated) item from the lowest rank holding it instead of
  // spreading them over ranks.
  bool dedup_to_lowest_rank = false;

  // --- performance ---
  // Files per rank, written in parallel by as many threads (DCP's thread_count). The
  // coordinator's value decides the file count of every rank. REQUIRES >= 1.
  int thread_count = 1;
  // O_DIRECT for the shard files where the storage supports it.
  bool direct_io = true;
};

struct SaveReport {
  std::vector<std::string> files;     // this rank's files
  std::uint64_t bytes_written = 0;    // by this rank (blobs, headers included)
  double plan_seconds = 0;            // steps 1-2
  double write_seconds = 0;           // step 3
  double commit_seconds = 0;          // steps 4-6
};

struct LoadOptions {
  // Fail (PlanError listing every problem) on missing keys and on dtype/shape mismatches.
  // false: load what matches and return the problems in LoadReport::problems.
  bool strict = true;
  // Verify the sidecar checksums of every byte read (blocks cut by the boxes are checked
  // from the ranks' pieces, step 4; bytes items are checked whole). Off: trust the storage. Blobs
  // without a sidecar entry (checkpoints PyTorch wrote) are read unverified either way.
  // Zip headers and data.pkl are checked structurally by the parser, not by checksum.
  bool verify_checksums = true;
  // Parallel readers per rank.
  int thread_count = 4;
};

struct LoadReport {
  std::vector<LoadProblem> problems;  // non-strict only
  std::uint64_t bytes_needed = 0;     // payload bytes this rank's boxes needed
  std::uint64_t bytes_read = 0;       // bytes this rank read from storage (incl. headers)
  // The part of bytes_read that is tensor data or whole bytes-item blobs (not zip/pickle
  // headers of tensor blobs). Equals bytes_needed when verify_checksums is off, and with it
  // on when the ranks together read every block they cut (a full reshard); otherwise
  // adds the parts of cut blocks no rank read.
  std::uint64_t data_bytes_read = 0;
  // True when the load planned from the load index (kIndexKey) instead of decoding
  // `.metadata` and the sidecar, which it does for checkpoints without a matching index.
  bool used_index = false;
  double seconds = 0;
};

// Saves `state` (this rank's part) into the checkpoint folder `checkpoint`.
// Throws UsageError for an invalid state, PlanError when ranks disagree (e.g. dtypes),
// StorageError / FormatError / CommError when any rank fails — on every rank.
SaveReport save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                const SaveOptions& options = {});

// Fills `state` (a template naming what this rank wants: tensor boxes with buffers, object
// leaves as placeholders) from the checkpoint folder, resharding as needed.
LoadReport load(StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                const LoadOptions& options = {});

// Reads and decodes `.metadata` (no communicator). Throws StorageError when it is missing
// ("not a committed checkpoint"), FormatError when it does not decode.
format::Metadata read_metadata(storage::Storage& checkpoint);

}  // namespace shardpoint::engine
