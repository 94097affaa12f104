// Fuzzes ChecksumSidecar::decode. Invariants: any input either decodes or throws
// FormatError (never crashes or hangs); a decoded sidecar re-encodes to JSON that decodes
// to the same entries.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/checksum_sidecar.h"
#include "shardpoint/error.h"

using shardpoint::FormatError;
using shardpoint::engine::ChecksumSidecar;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ChecksumSidecar sidecar;
  try {
    sidecar = ChecksumSidecar::decode(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/sidecar");
  } catch (const FormatError&) {
    return 0;
  }
  ChecksumSidecar again;
  try {
    again = ChecksumSidecar::decode(sidecar.encode(), "re-encoded");
  } catch (const FormatError& e) {
    std::fprintf(stderr, "encode output does not decode: %s\n", e.what());
    std::abort();
  }
  if (again.algorithm() != sidecar.algorithm() || again.block_size() != sidecar.block_size() ||
      again.items() != sidecar.items()) {
    std::fprintf(stderr, "decode(encode(sidecar)) differs from sidecar\n");
    std::abort();
  }
  return 0;
}
