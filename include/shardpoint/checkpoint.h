// save() and load(): sharded checkpoints in PyTorch's DCP format (docs/dcp-format.md), SPMD:
// every rank of the communicator calls them with its own part of the state.
//
// save() commits atomically: the coordinator writes `.metadata` (kMetadataKey), the commit
// marker, only after every rank has written its files, so no reader (PyTorch's or ours)
// sees a partial checkpoint; when save() returns on any rank the checkpoint is committed.
// Saving into a folder that holds a committed checkpoint first removes its `.metadata`,
// sidecar and load index (its data files are about to be overwritten); other files are
// never touched. `.metadata` is written create-only (WriteOptions::if_absent, where the
// driver has features().conditional_put): of two saves racing into one folder, the second
// to commit throws StorageError kAlreadyExists instead of both returning as committed (the
// folder then holds the first's `.metadata` over files both wrote). load() reads only the byte ranges the requested
// boxes need, from a checkpoint saved by any number of ranks, and verifies them against the checksum sidecar when
// asked.
//
// Failure (save and load): when any rank fails in any step, every rank throws one error of
// the lowest failed rank's category whose message names all failed ranks and their
// messages: "save failed on ranks 1, 3 (of 4): rank 1: <message>; rank 3: <message>". A
// failed save never writes `.metadata`; each rank removes the files it already committed
// in this attempt and the coordinator the sidecar (best effort). A rank that dies makes the
// others throw the communicator's CommError (after its timeout), with the same cleanup.
//
// The numbered steps of both, the messages ranks exchange and the read path are described
// at the top of checkpoint.cc (save) and checkpoint_load.cc (load).
//
// Thread-safety: one save()/load() per communicator at a time. Blocking. load() fills the
// caller's buffers from up to LoadOptions::thread_count threads and writes object leaves
// from the calling thread; on failure the state may be partly filled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/communicator.h"
#include "shardpoint/metadata.h"
#include "shardpoint/state_dict.h"
#include "shardpoint/storage.h"
#include "shardpoint/zip_crc_counts.h"

namespace shardpoint::engine {

// The index of a DCP checkpoint; its presence commits the checkpoint (docs/dcp-format.md §1.1).
inline constexpr const char* kMetadataKey = ".metadata";

// Name of the checksum sidecar in a checkpoint folder (format: checksum_sidecar.h).
// PyTorch ignores it. Written only when SaveOptions::checksum is not kNone.
inline constexpr const char* kChecksumSidecar = ".shardpoint-checksums.json";
// Name of the load index (format: checkpoint_index.h): `.metadata`, the checksums and where
// each tensor blob's data starts, in a binary form every rank of a load decodes quickly.
// PyTorch ignores it; a load uses it only when it matches the `.metadata` it read.
inline constexpr const char* kIndexKey = ".shardpoint-index";

// The kinds of checkpoint shardpoint reads (engine/checkpoint_location.h decides which a
// path or URL names). A folder is kDcp or kHfSafetensors.
enum class CheckpointKind {
  kDcp,            // `.metadata` + `__r_n.distcp` (torch.save or safetensors items)
  kHfSafetensors,  // *.safetensors (+ model.safetensors.index.json), docs/dcp-format.md §7
  kTorchSave,      // one torch.save file
};

// "dcp", "hf-safetensors", "torch": the `format` of `inspect --json` and `verify --json`.
std::string_view checkpoint_kind_name(CheckpointKind kind);

// Persisted in the sidecar by name ("crc32c", "xxh3"); existing names must never change.
enum class ChecksumAlgorithm { kNone, kCrc32c, kXxh3 };

// How save stores each item (docs/dcp-format.md §2.4).
enum class Compression {
  kNone,  // the torch.save blob as is
  kZstd,  // one zstd frame per item, descriptor "stream.zstd/1" (PyTorch's ZStandard extension)
};

// The names the CLI (--compress) and the C API's callers use: "none", "zstd".
// compression_from_name throws UsageError naming `what` and the accepted names for any other.
std::string_view compression_name(Compression compression);
Compression compression_from_name(std::string_view name, std::string_view what);

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
  // kZstd: every item compressed into one zstd frame, recorded as PyTorch's ZStandard
  // extension records it, so PyTorch >= 2.7 reads it back (with the `zstandard` or `pyzstd`
  // module installed) and older PyTorch cannot. Costs CPU on save and load; a reader of
  // part of an item decompresses it from its start. Float weights shrink little (~10%).
  Compression compression = Compression::kNone;
  // zstd level (1..19). 3 is what PyTorch's extension uses; higher is smaller and slower.
  int compression_level = 3;
  // Threads compressing a rank's items at once (kZstd only): items up to 64 MiB are
  // compressed into memory ahead of the file threads (at most 256 MiB of them per file) and
  // appended in order, the bytes those threads would write; larger items stream to the file
  // with libzstd's workers (this many). 0: one per hardware thread. 1: each file thread
  // compresses its own items, no extra threads or memory. Lower it when ranks share cores.
  int compression_threads = 0;

  // --- performance ---
  // Files per rank, written in parallel by as many threads (DCP's thread_count). The
  // coordinator's value decides the file count of every rank. Raised to 4 on object stores
  // (StorageFeatures::object_store: s3://, az://, gs://), where one object would be one
  // upload stream and one object to read per rank. Cost: each writer holds its own upload
  // buffers (on gs://, two resumable chunks). REQUIRES >= 1.
  int thread_count = 1;
  // O_DIRECT for the shard files where the storage supports it.
  bool direct_io = true;
};

struct SaveReport {
  std::vector<std::string> files;   // this rank's files
  std::uint64_t bytes_written = 0;  // by this rank (blobs, headers included)
  double plan_seconds = 0;          // local and global plan (steps 1-2 in checkpoint.cc)
  double write_seconds = 0;         // writing this rank's files (step 3)
  double commit_seconds = 0;        // agreeing, `.metadata`, final barrier (steps 4-6)
};

struct LoadOptions {
  // Fail (PlanError listing every problem) on missing keys and on dtype/shape mismatches.
  // false: load what matches and return the problems in LoadReport::problems.
  bool strict = true;
  // Verify the sidecar checksums of every byte read (blocks cut by the boxes are checked
  // from the pieces the ranks read; bytes items are checked whole). Off: trust the storage
  // (no check at all, check_zip_crc included). Blobs without a sidecar entry (checkpoints
  // PyTorch wrote) are checked by their zip CRC-32s instead (check_zip_crc).
  bool verify_checksums = true;
  // Where no sidecar entry covers a blob (checkpoints PyTorch wrote, or shardpoint's saved
  // without checksums), check the zip CRC-32 each torch.save record carries: every record a
  // rank reads whole, computed right after each read while the bytes are in cache. A record
  // a resharding load reads only in part on this rank is not checked
  // (LoadReport::zip_crc.records_partial). Applies only with verify_checksums. Off: such
  // blobs are read unverified. Cost: one CRC-32 pass over the bytes read while they are
  // in cache: +6-11 % of a warm load's time, within the noise of a cold one.
  bool check_zip_crc = true;
  // Parallel readers per rank.
  int thread_count = 4;
};

// One mismatch between what a load asked for and what the checkpoint holds.
struct LoadProblem {
  enum class Kind {
    kMissingKey,          // requested, not in the checkpoint
    kUnexpectedKey,       // in the checkpoint, not requested (an error only if asked for)
    kTypeMismatch,        // tensor requested, bytes saved, or the reverse
    kDTypeMismatch,       // tensor dtypes differ (shardpoint does not convert)
    kShapeMismatch,       // global shapes differ
    kIncompleteCoverage,  // the saved chunks do not cover the requested box exactly once
  };
  Kind kind;
  std::string fqn;
  std::string expected;  // what the caller asked for
  std::string found;     // what the checkpoint holds

  bool operator==(const LoadProblem&) const = default;
  // e.g. "w": dtype mismatch: expected float32, found bfloat16
  std::string to_string() const;
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
  // The zip CRC-32 checks of this rank (check_zip_crc): records checked, written without a
  // CRC-32, and read only in part (unchecked).
  ZipCrcCounts zip_crc;
  double seconds = 0;
};

// Saves `state` (this rank's part) into the checkpoint folder `checkpoint`.
// Throws UsageError for an invalid state, PlanError when ranks disagree (e.g. dtypes),
// StorageError / FormatError / CommError when any rank fails — on every rank.
SaveReport save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                const SaveOptions& options = {});

// Fills `state` (a template naming what this rank wants: tensor boxes with buffers, object
// leaves as placeholders) from the checkpoint folder (DCP, or Hugging Face safetensors),
// resharding as needed.
LoadReport load(StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                const LoadOptions& options = {});

// Reads and decodes `.metadata` (no communicator); for a Hugging Face safetensors folder, the
// Metadata its headers give. Safetensors tensor items (theirs, and DCP's safetensors
// serialization) name their raw bytes (docs/dcp-format.md §7). Throws StorageError when it
// is missing ("not a committed checkpoint"), FormatError when it does not decode.
format::Metadata read_metadata(storage::Storage& checkpoint);

}  // namespace shardpoint::engine
