// A DCP checkpoint holding a bytes item whose object holds tensors, laid out as PyTorch
// writes one (docs/dcp-format.md §2.5) but built in-process through the planned-I/O path
// (the one DCP's own planner uses through the C API), so engine tests need no oracle:
//   "w"    a float32 [2, 3] tensor item;
//   "pair" the bytes item torch.save((t, 'l2', t[1:])), t = float32 [1.5, 2.5, 3.5]: one
//          storage record data/0, referenced twice (the second view at offset 1).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "core/byte_stream.h"
#include "engine/planned_io.h"
#include "format/metadata_codec.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/storage.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine::testing {

struct ObjectItemCheckpoint {
  std::string pair_blob;     // the bytes item "pair", as stored
  std::string pair_storage;  // its storage's 12 bytes
  std::string w_bytes;       // the 24 bytes of "w"
};

inline std::string float_bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Writes the checkpoint into the empty `st` and commits it.
inline ObjectItemCheckpoint write_object_item_checkpoint(storage::Storage& st) {
  using pickle::Value;
  ObjectItemCheckpoint c;
  c.pair_storage = float_bytes({1.5F, 2.5F, 3.5F});
  c.w_bytes = float_bytes({0, 1, 2, 3, 4, 5});
  const std::vector<std::int64_t> three{3}, two{2}, one{1};
  pickle::ValuePtr pair =
      Value::tuple({torchfile::make_tensor_node(DType::kFloat32, three, one, 0, "0", 3), Value::str("l2"),
                    torchfile::make_tensor_node(DType::kFloat32, two, one, 1, "0", 3)});
  StringSink sink;
  torchfile::TorchSaveWriter writer(sink);
  writer.write_pickle(*pair);
  writer.write_storage("0", as_bytes(c.pair_storage));
  writer.finish();
  c.pair_blob = sink.take();

  PlannedFile file;
  file.name = "__0_0.distcp";
  PlannedItem w;
  w.type = WriteItemType::kTensor;
  w.index = format::MetadataIndex{"w", format::Shape{0, 0}, 0};
  w.dtype = DType::kFloat32;
  w.sizes = {2, 3};
  w.bytes = as_bytes(c.w_bytes);
  PlannedItem p;
  p.type = WriteItemType::kBytes;
  p.index = format::MetadataIndex{"pair", std::nullopt, std::nullopt};
  p.bytes = as_bytes(c.pair_blob);
  file.items = {w, p};
  SaveOptions options;
  options.durable = false;
  const std::vector<WrittenItem> written = write_planned_files(st, {file}, options);

  format::Metadata md;
  format::TensorStorageMetadata t;
  t.size = {2, 3};
  t.chunks = {format::ChunkStorageMetadata{{0, 0}, {2, 3}}};
  md.state_dict_metadata["w"] = t;
  md.state_dict_metadata["pair"] = format::BytesStorageMetadata{};
  md.planner_data = {{"w", {std::string("w")}}, {"pair", {std::string("pair")}}};
  for (const WrittenItem& item : written) md.storage_data[item.index] = item.info;
  commit_planned(st, format::encode_metadata(md), written, options);
  return c;
}

}  // namespace shardpoint::engine::testing
