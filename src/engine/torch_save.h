// Writing a whole (unsharded) state as one torch.save file: the format of a consolidated
// checkpoint, a Lightning "full" checkpoint and meta.pt.
//
// The tree becomes the pickle torch.save writes: mappings -> dict (str keys), lists ->
// list, objects -> their pickle value as is, tensors -> _rebuild_tensor_v2/_v3 nodes with
// one storage each (data/0, data/1, ... in tree order). Tensor bytes stream from the
// caller's buffers into the sink; nothing is staged. The output loads with
// torch.load(weights_only=True) when the objects are plain containers and numbers.
//
// Thread-compatible.
#pragma once

#include <string>

#include "core/byte_stream.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::engine {

struct TorchSaveFileOptions {
  // Folder name of the records inside the zip ("archive" for streams, the file's stem
  // when PyTorch saves to a path).
  std::string archive_name = "archive";
};

// Writes root as one torch.save archive into sink. Every tensor leaf must be a whole tensor
// (offsets all zero, sizes == global_shape) with data of volume * itemsize bytes.
// Throws UsageError naming the key of a bad leaf; what the sink throws on I/O errors.
void write_torch_save(const StateNode& root, ByteSink& sink, const TorchSaveFileOptions& options = {});

}  // namespace shardpoint::engine
