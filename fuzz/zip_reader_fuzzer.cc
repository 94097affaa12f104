// Fuzzes ZipArchive. Invariants: parsing never crashes and throws only FormatError; every
// entry's data range lies inside the input; reading a stored entry returns exactly its size.
#include <cstdint>
#include <cstdlib>

#include "shardpoint/error.h"
#include "torchfile/zip_reader.h"

using namespace shardpoint;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  MemorySource src(ByteSpan(reinterpret_cast<const std::byte*>(data), size), "fuzz.zip");
  try {
    torchfile::ZipArchive zip(src);
    for (const torchfile::ZipEntry& e : zip.entries()) {
      if (e.data_offset > size || e.compressed_size > size - e.data_offset) std::abort();
      if (e.local_header_offset >= size) std::abort();
      if (zip.find(e.name) == nullptr) std::abort();
      try {
        torchfile::ByteRange r = zip.data_range(e);
        if (r.offset + r.size > size) std::abort();
        if (zip.read(e).size() != r.size) std::abort();
      } catch (const FormatError&) {
        if (e.method == 0) std::abort();  // stored entries always give their data
      }
    }
  } catch (const FormatError&) {
  }
  return 0;
}
