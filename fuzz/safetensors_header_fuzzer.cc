// Fuzzes read_safetensors_header over a whole file. Invariants: any input either parses or
// throws FormatError (never crashes, hangs or allocates beyond the input); a parsed header's
// tensors lie inside the data, hold exactly their shape's bytes and do not overlap; and the
// tensors written again by SafetensorsWriter (data copied from the input) parse back to the
// same names, dtypes, shapes and bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "format/safetensors_header.h"
#include "format/safetensors_writer.h"
#include "shardpoint/error.h"

using shardpoint::ByteSpan;
using shardpoint::FormatError;
using shardpoint::MemorySource;
using shardpoint::StringSink;
namespace format = shardpoint::format;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "safetensors_header_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const ByteSpan bytes(reinterpret_cast<const std::byte*>(data), size);
  const MemorySource source(bytes, "fuzz.safetensors");
  format::SafetensorsHeader header;
  try {
    header = format::read_safetensors_header(source, 0, "fuzz.safetensors");
  } catch (const FormatError&) {
    return 0;
  }
  const std::uint64_t data_bytes = size - header.data_start();
  std::vector<const format::SafetensorsTensor*> order;
  for (const auto& t : header.tensors) {
    std::uint64_t n = shardpoint::dtype_itemsize(t.dtype);
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    if (t.begin > t.end || t.end > data_bytes || t.end - t.begin != n) fail("a tensor's bytes are not its shape's");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i - 1]->end > order[i]->begin && order[i]->end > order[i]->begin) fail("overlapping tensors accepted");
  }
  // Round trip: the same tensors written in data order parse back equal.
  std::vector<format::SafetensorsEntry> entries;
  for (const auto* t : order) {
    if (!format::safetensors_dtype(t->dtype)) fail("parsed a dtype the writer cannot name");
    entries.push_back({t->name, t->dtype, t->shape});
  }
  StringSink sink;
  try {
    format::SafetensorsWriter writer(sink, entries, header.metadata);
    for (const auto* t : order) writer.write(bytes.subspan(header.data_start() + t->begin, t->end - t->begin));
    writer.finish();
  } catch (const shardpoint::UsageError&) {
    return 0;  // a name the writer refuses ("__metadata__" inside metadata-less input, duplicates)
  }
  const std::string& out = sink.str();
  const MemorySource again_source(shardpoint::as_bytes(out), "again.safetensors");
  format::SafetensorsHeader again;
  try {
    again = format::read_safetensors_header(again_source, 0, "again.safetensors");
  } catch (const FormatError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("the writer's output does not parse");
  }
  if (again.tensors.size() != order.size() || again.metadata != header.metadata) fail("round trip lost tensors");
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& t = again.tensors[i];
    if (t.name != order[i]->name || t.dtype != order[i]->dtype || t.shape != order[i]->shape)
      fail("round trip changed a tensor");
    if (!std::equal(out.begin() + static_cast<std::ptrdiff_t>(again.data_start() + t.begin),
                    out.begin() + static_cast<std::ptrdiff_t>(again.data_start() + t.end),
                    reinterpret_cast<const char*>(data) + header.data_start() + order[i]->begin)) {
      fail("round trip changed a tensor's bytes");
    }
  }
  return 0;
}
