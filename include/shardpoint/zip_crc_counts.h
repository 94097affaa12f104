// ZipCrcCounts: what the zip CRC-32 checks of a read pass found. Loads, CheckpointReader,
// consolidate and reshard check the CRC-32 that every torch.save record carries in its
// central directory wherever no checksum sidecar covers a blob (checkpoints PyTorch wrote);
// their reports carry these counts.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

namespace shardpoint::engine {

struct ZipCrcCounts {
  std::uint64_t records_checked = 0;      // records whose CRC-32 matched
  std::uint64_t bytes_checked = 0;        // their data bytes
  std::uint64_t records_no_checksum = 0;  // written without a CRC-32: unchecked, not an error
  std::uint64_t records_partial = 0;      // read only in part: unchecked
  ZipCrcCounts& operator+=(const ZipCrcCounts& o) {
    records_checked += o.records_checked;
    bytes_checked += o.bytes_checked;
    records_no_checksum += o.records_no_checksum;
    records_partial += o.records_partial;
    return *this;
  }
};

}  // namespace shardpoint::engine
