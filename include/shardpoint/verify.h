// verify(): checks that a checkpoint is complete and intact, and says which checks covered
// which bytes. `shardpoint verify` prints the VerifyReport; the engine does the checking.
//
// What is checked, for a DCP checkpoint (a folder or a storage URL with `.metadata`):
//   1. Structure: `.metadata` decodes and is consistent (format::check_metadata: chunks tile
//      each tensor exactly, every item has a storage entry, safe relative paths, no
//      overlapping byte ranges); every referenced file is present and long enough for its
//      items (and, for a local folder, no symlink leads out of it); the load index, when
//      present, binds to this `.metadata` and agrees with it, the sidecar and the blobs;
//      every item's blob is a torch.save zip whose records, local headers and data
//      descriptors agree with its central directory (torchfile/zip_record_check.h) and whose
//      data.pkl parses to what `.metadata` says (a tensor chunk of its dtype and shape, or
//      an object).
//   2. Unless options.quick: every tensor chunk is read through the load path
//      (CheckpointReader::read_box), which checks it against the checksum sidecar
//      (`.shardpoint-checksums.json`, CRC-32C or XXH3 blocks) when there is one; every
//      object is read and checked against its sidecar checksum.
//   3. Unless options.quick: the zip CRC-32 of every record of every blob (tensor data,
//      data.pkl, the small records) against the blob's central directory - the only
//      checksum of a checkpoint without a sidecar (PyTorch's), and a second one where a
//      sidecar exists. Blobs that already failed step 1 or 2 are not checked again, so a
//      damaged blob is one problem.
//   4. `meta.pt`, when present, as a torch.save file (below).
// For a Hugging Face safetensors folder (docs/dcp-format.md §7): every file's header parses
// and its byte ranges lie inside the file without overlapping, the index JSON names the file
// of each tensor, the chunks tile each tensor, and (unless quick) every tensor is read;
// safetensors has no checksum, so none of its bytes count as verified. DCP's safetensors
// items get the same header checks, their bytes items the zip checks above.
// For a torch.save file (a local file, or an object named by a URL): its zip structure and
// data.pkl, every record's headers, and (unless quick) every record's CRC-32.
//
// A record whose writer stored no CRC-32 (newer PyTorch can skip it; zip_record_check.h)
// is neither a problem nor verified: its bytes are counted as no_checksum_bytes. Bytes are
// "verified" only when a checksum covered them and matched.
//
// Errors: problems found in the checkpoint are entries of the report, never exceptions, and
// the scan goes on after each (one problem per damaged item). verify() throws only when the
// checkpoint cannot be found or located at all: StorageError kNotFound for a missing local
// path or a URL that is neither a DCP checkpoint nor an object; StorageError for
// authentication / network errors while locating. UsageError for options out of range.
//
// Cost: reads every byte of the checkpoint; tensor data twice when not quick (once through
// the load path, once for the zip CRC-32; the second read is usually served by the page
// cache or the object-store source's read cache). Memory: one slab of options.slab_bytes
// plus one blob's headers and data.pkl at a time; objects are read whole.
//
// Thread-safety: verify() calls may run concurrently (on the same checkpoint too); one call
// runs on the calling thread and blocks until done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardpoint/checkpoint.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

struct VerifyOptions {
  // Structure only (step 1 above): headers, data.pkl and objects are read, tensor data is
  // not, and no checksum is checked. Seconds instead of a full read of the checkpoint.
  bool quick = false;
  // Bytes of tensor data read at once (one buffer, the bulk of verify's memory). Smaller
  // means more, smaller reads. REQUIRES > 0.
  std::size_t slab_bytes = std::size_t{32} << 20;
};

// One problem. `message` is the whole line as `shardpoint verify` prints it; it names the
// file and the item itself.
struct VerifyProblem {
  std::string file;  // the file it is in (".metadata", "__1_0.distcp", a torch.save file's
                     // path); empty when it concerns no one file
  std::string item;  // "fqn" or "fqn chunk [0:4, 0:8]" (DCP), a record name (torch.save);
                     // empty when it concerns a whole file
  std::string message;
};

// Which checks covered the bytes of one checkpoint: a DCP checkpoint's blobs, or one
// torch.save file (a checkpoint's meta.pt has its own entry).
struct VerifyCoverage {
  std::string name;  // the checkpoint or file, as in messages
  CheckpointKind kind = CheckpointKind::kTorchSave;
  bool quick = false;  // structure only: no checksum was checked
  // Bytes whose structure was checked: DCP, the blobs of the items read; torch.save, the
  // whole file.
  std::uint64_t bytes = 0;
  // Zip records found, and of their data bytes: those whose CRC-32 matched the central
  // directory, and those whose writer recorded no CRC-32.
  std::uint64_t records = 0;
  std::uint64_t record_bytes = 0;
  std::uint64_t zip_crc32_records = 0;
  std::uint64_t zip_crc32_bytes = 0;
  std::uint64_t no_checksum_records = 0;
  std::uint64_t no_checksum_bytes = 0;
  // The sidecar's algorithm (kNone: no sidecar, or quick) and the bytes checked against it:
  // tensor data read through the load path and whole object blobs.
  ChecksumAlgorithm sidecar = ChecksumAlgorithm::kNone;
  std::uint64_t sidecar_block_size = 0;
  std::uint64_t sidecar_bytes = 0;
};

struct VerifyReport {
  std::string name;  // the path or URL as given
  CheckpointKind kind = CheckpointKind::kTorchSave;
  bool quick = false;
  std::vector<VerifyProblem> problems;  // in the order found
  // Tensors whose chunks all checked clean (torch.save: tensor nodes of the file), objects
  // (meta.pt counts as one).
  std::uint64_t tensors = 0;
  std::uint64_t objects = 0;
  // Tensor data bytes read (DCP) plus the record bytes of torch.save files; 0 when quick.
  std::uint64_t bytes = 0;
  // Of `bytes`, those a checksum covered and matched (the sidecar, or the zip CRC-32 of every
  // record of the blob). The rest had no checksum: read and parsed only.
  std::uint64_t verified_bytes = 0;
  // The checkpoint first, then its meta.pt when present.
  std::vector<VerifyCoverage> coverage;

  bool ok() const { return problems.empty(); }
};

// Verifies the checkpoint at a local path (a DCP folder or a torch.save file; "file://"
// accepted) or a storage URL (told apart as reshard.h describes for sources). Blocks until
// done. Throws as described at the top; every problem inside the checkpoint is in the report.
VerifyReport verify(const Location& where, const VerifyOptions& options = {});
// Location::parse(path_or_url), then the above.
VerifyReport verify(const std::string& path_or_url, const VerifyOptions& options = {});

// Verifies the checkpoint folder in `storage` (DCP, or Hugging Face safetensors: no
// checksum there, its headers and byte ranges are the structure checked; tests use
// MemoryStorage). `local_folder`: the
// folder's path when the checkpoint is on the local filesystem, so symlinks are checked not
// to leave it. `name` names the checkpoint in the report. A missing or unreadable
// `.metadata` is a problem in the report, not an exception.
VerifyReport verify_dcp(const std::shared_ptr<storage::Storage>& storage,
                        const std::optional<std::string>& local_folder, const std::string& name,
                        const VerifyOptions& options = {});

}  // namespace shardpoint::engine
