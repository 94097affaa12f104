// Consolidation: one sharded checkpoint folder (a Lightning FSDP or ModelParallel
// checkpoint, a plain PyTorch DCP folder, or a Hugging Face safetensors folder with kDcp)
// turned into one file that torch.load reads, streaming with a fixed memory budget
// (docs/lightning-layout.md §4, docs/dcp-format.md §6.1).
//
// What is written (torch.save output):
//   kTrainer  Lightning's `python -m lightning.pytorch.utilities.consolidate_checkpoint`:
//             the DCP state (nesting rebuilt from planner_data), then meta.pt merged on top
//             (dict.update: a meta key replaces a DCP key in place, new keys are appended),
//             then "model" moved to the end as "state_dict", then the keys matching the
//             prefix regex `optimizer_[0-9]+` (N of them) popped as optimizer_0..N-1 into a
//             list "optimizer_states" at the end. A ModelParallelStrategy checkpoint (module
//             state saved under "state_dict", no "model"; engine/lightning_layout.h) gets
//             its "state_dict" moved to the end instead, where Lightning 2.6 fails with
//             KeyError 'model'. Neither key, or a gap in the optimizer indices, is a
//             PlanError (Lightning raises KeyError there).
//   kFabric   the same merge, keys as saved (lightning.fabric's consolidator).
//   kDcp      any DCP folder: what torch's dcp_to_torch_save writes; where the folder holds
//             meta.pt (a Lightning checkpoint) it is merged on top as for kFabric (what
//             Lightning's _load_distributed_checkpoint returns), so the trainer state stays.
// Every tensor is written as a contiguous CPU tensor (requires_grad false for DCP tensors;
// meta.pt tensors keep requires_grad and Parameter-ness). Objects from meta.pt and DCP bytes
// items are carried through as their pickle values. Dict key order inside the DCP part
// follows the order of state_dict_metadata in the .metadata pickle, as PyTorch's
// _EmptyStateDictLoadPlanner does (shardpoint writes that dict sorted by key).
//
// Safetensors output (kSafetensors): the model weights (the "model" subtree, or
// "state_dict" for ModelParallel's layout, or every tensor with kDcp) named by their
// dotted key inside that subtree; one file, or, with max_shard_bytes, a folder of
// model-0000i-of-0000n.safetensors files plus model.safetensors.index.json (a tensor
// larger than the limit gets a file of its own).
//
// Locations: the checkpoint folder and the output may each be a local path or an
// object-store URL (s3://, gs://, az://, abfs[s]://, memory://; storage::open_storage), in
// any combination. For a URL, Lightning's checks are made on the prefix (objects under it,
// meta.pt among them; no object at the output key nor under it as a prefix). Remote input is
// read with ranged reads straight into the slab buffers; remote output goes through the
// driver's StorageWriter (multipart / block upload of parts from our pool), visible only at
// commit, aborted when the copy fails or is cancelled. Sharded safetensors output to a URL:
// shard objects first, model.safetensors.index.json last; on failure the shards already
// committed are removed.
//
// Streaming: data.pkl is written first from .metadata alone (engine/consolidated_tree.h);
// then each tensor's record is filled in row-major order through a fixed slab of buffers
// (engine/slab_pipeline.h): boxes read with CheckpointReader::read_box (only the needed
// byte ranges; sidecar checksums verified), written in order while the next are read.
// Blob headers are read through shared windows (storage/windowed_storage.h); local shard
// files are read with pread, never mapped, so their pages do not count in our RSS.
// Memory: what the process holds when the copy starts, a reserve, the writer's staging and
// the slab, split from memory_budget_bytes by engine/copy_memory_plan.h; independent of the
// checkpoint's size.
//
// Atomic output: locally, a temporary file (or folder) next to the output, fsynced and
// renamed onto the output path at the end; on any error or cancellation the temporary is
// removed and nothing appears at the output path. Object stores: see Locations.
//
// Thread-safety: consolidate() may run concurrently for different outputs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/location.h"
#include "shardpoint/zip_crc_counts.h"

namespace shardpoint::engine {

enum class ConsolidateLayout { kTrainer, kFabric, kDcp };
// kHfSafetensors: the Hugging Face folder layout always (model-00001-of-00001.safetensors +
// index when one file holds everything), what HuggingFaceStorageWriter's consolidation
// writes; kSafetensors: one file unless max_shard_bytes splits it.
enum class ConsolidateFormat { kTorchSave, kSafetensors, kHfSafetensors };

// The names the CLI (--layout, --to) and the C API's callers use: "trainer", "fabric",
// "dcp"; "torch", "safetensors", "hf-safetensors". The *_from_name functions throw
// UsageError naming `what` (the option) and the accepted names for any other name.
std::string_view consolidate_layout_name(ConsolidateLayout layout);
ConsolidateLayout consolidate_layout_from_name(std::string_view name, std::string_view what);
std::string_view consolidate_format_name(ConsolidateFormat format);
ConsolidateFormat consolidate_format_from_name(std::string_view name, std::string_view what);

struct ConsolidateOptions {
  // The checkpoint folder: a local path or an object-store URL prefix.
  Location checkpoint_folder;
  // Output path or URL; none: "<checkpoint_folder>.consolidated" (a bucket-root URL needs an
  // explicit output). A local output's parent directory must exist (it is not created, as
  // Lightning).
  std::optional<Location> output_file;
  ConsolidateLayout layout = ConsolidateLayout::kTrainer;
  ConsolidateFormat format = ConsolidateFormat::kTorchSave;
  // Safetensors only: split the weights into files of at most this many data bytes
  // (0: one file), in key order, a tensor larger than the limit alone in its file.
  std::uint64_t max_shard_bytes = 0;
  // Upper bound for the memory the copy uses (slab buffer + writer staging), and the
  // target for the process's peak RSS. Lower it on small machines; below ~8 MiB the fixed
  // cost of the process dominates.
  std::uint64_t memory_budget_bytes = std::uint64_t{256} << 20;
  // Verify the checksum sidecar (when the checkpoint has one) on every byte read.
  bool verify_checksums = true;
  // Where no sidecar covers a blob (PyTorch's checkpoints), check the zip CRC-32 of every
  // record read, folded into the reads (checkpoint_reader.h), and every record of meta.pt
  // (read whole when the layout uses it); a mismatch fails before the output is published.
  // Applies only with verify_checksums.
  bool check_zip_crc = true;
  // fsync the output before the rename. Turn off only for benchmarks.
  bool durable = true;
  // Checked between slabs; when it becomes non-zero, consolidate() throws Cancelled.
  const std::atomic<int>* cancel = nullptr;
};

struct ConsolidateProgress {
  std::uint64_t bytes_done = 0;   // tensor bytes copied so far
  std::uint64_t bytes_total = 0;  // tensor bytes to copy
};

struct ConsolidateReport {
  Location output;                   // where the output was written
  std::uint64_t tensors = 0;         // tensor records written
  std::uint64_t objects = 0;         // DCP bytes items carried through
  std::uint64_t tensor_bytes = 0;    // tensor data bytes copied
  std::uint64_t bytes_read = 0;      // from the shard files (headers, widening included)
  std::size_t slab_bytes = 0;        // size of the one copy buffer
  std::uint64_t base_rss_bytes = 0;  // VmRSS when the copy was planned
  std::uint64_t peak_rss_bytes = 0;  // VmHWM at the end (the process's peak so far)
  ZipCrcCounts zip_crc;              // zip CRC-32 checks of blobs no sidecar covers, and meta.pt
  double seconds = 0;
};

// Thrown when ConsolidateOptions::cancel was set; the output was not written.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("interrupted; no output written") {}
};

// Runs the whole consolidation. `progress` (may be empty) is called from this thread after
// each slab. Throws PlanError (validation, Lightning's messages; layout problems),
// FormatError (bad .metadata, blobs, meta.pt), StorageError (missing or short shard files,
// full disk, missing output directory), Cancelled. Blocking.
ConsolidateReport consolidate(const ConsolidateOptions& options,
                              const std::function<void(const ConsolidateProgress&)>& progress = {});

}  // namespace shardpoint::engine
