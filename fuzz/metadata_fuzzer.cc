// Fuzzes decode_metadata and the rebuild the Python package unpickles (decode, then
// encode: sp_metadata_rebuild). Invariants: any input either decodes or throws FormatError
// (never crashes, hangs or allocates beyond the input); a decoded Metadata survives
// encode -> decode unchanged (up to the fields encode drops: storage_meta, version,
// planner_data_raw) and re-encodes to the same bytes; the re-encoding names no global but
// those python/shardpoint/_trust.py resolves, whatever the input named.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "format/metadata_codec.h"
#include "pickle/reader.h"
#include "pickle/value_graph.h"
#include "shardpoint/dtype.h"
#include "shardpoint/error.h"

using shardpoint::FormatError;
using shardpoint::format::Metadata;

namespace {

// The globals python/shardpoint/_trust.py's unpickler resolves (besides torch dtypes).
bool rebuild_may_name(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kAllowed = {
      {"torch.distributed.checkpoint.metadata", "Metadata"},
      {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
      {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},
      {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
      {"torch", "Size"},
      {"torch.serialization", "_get_layout"},
  };
  if (kAllowed.count({module, name}) != 0) return true;
  return module == "torch" && shardpoint::dtype_from_name(name).has_value();
}

// Aborts when the pickle `encoded` names a global the Python rebuild does not resolve.
void check_rebuild_globals(const std::string& encoded) {
  using shardpoint::pickle::Kind;
  using shardpoint::pickle::ValuePtr;
  const ValuePtr root = shardpoint::pickle::read_pickle(shardpoint::as_bytes(encoded), "re-encoded");
  std::vector<const shardpoint::pickle::Value*> todo{root.get()};
  std::set<const shardpoint::pickle::Value*> seen;
  while (!todo.empty()) {
    const shardpoint::pickle::Value* v = todo.back();
    todo.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    if (v->is(Kind::kGlobal) && !rebuild_may_name(v->module(), v->name())) {
      std::fprintf(stderr, "the rebuild names %s.%s\n", v->module().c_str(), v->name().c_str());
      std::abort();
    }
    for (std::size_t i = 0; i < shardpoint::pickle::child_count(*v); ++i) {
      todo.push_back(shardpoint::pickle::child_at(*v, i).get());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Metadata md;
  try {
    md = shardpoint::format::decode_metadata({reinterpret_cast<const std::byte*>(data), size}, "fuzz/.metadata");
  } catch (const FormatError&) {
    return 0;
  }
  const std::string encoded = shardpoint::format::encode_metadata(md);
  Metadata again;
  try {
    again = shardpoint::format::decode_metadata(shardpoint::as_bytes(encoded), "re-encoded");
  } catch (const FormatError& e) {
    std::fprintf(stderr, "encode output does not decode: %s\n", e.what());
    std::abort();
  }
  if (!shardpoint::format::same_encoded_content(md, again)) {
    std::fprintf(stderr, "decode(encode(md)) differs from md\n");
    std::abort();
  }
  if (shardpoint::format::encode_metadata(again) != encoded) {
    std::fprintf(stderr, "encode is not stable across a round trip\n");
    std::abort();
  }
  check_rebuild_globals(encoded);
  (void)shardpoint::format::check_metadata(md);
  return 0;
}
