// Fuzzes decode_metadata. Invariants: any input either decodes or throws FormatError
// (never crashes, hangs or allocates beyond the input); a decoded Metadata survives
// encode -> decode unchanged (up to the fields encode drops: storage_meta, version,
// planner_data_raw) and re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/metadata_codec.h"
#include "shardpoint/error.h"

using shardpoint::FormatError;
using shardpoint::format::Metadata;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Metadata md;
  try {
    md = shardpoint::format::decode_metadata(
        {reinterpret_cast<const std::byte*>(data), size}, "fuzz/.metadata");
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
  (void)shardpoint::format::check_metadata(md);
  return 0;
}
