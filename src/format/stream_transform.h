// The stream transforms of an item (`_StorageInfo.transform_descriptors`, PyTorch 2.7+,
// docs/dcp-format.md §2.4): which ones this build undoes and how a descriptor is named.
//
// A descriptor is "<name>[@domain]/<version>" (PyTorch's Extension.get_descriptor). The
// list is in the order a reader undoes them. PyTorch defines one, ZStandard:
// "stream.zstd/1", accepted with any "1.x" version as PyTorch's ZStandard.from_descriptor
// does. shardpoint undoes a list of exactly one zstd transform (what PyTorch writes); any
// other list is refused by name.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardpoint::format {

// What a reader must undo to get the torch.save blob. The values reach disk only as
// descriptors (kZstdDescriptor), never as numbers.
enum class StreamTransform {
  kNone,  // no transform_descriptors: the stored bytes are the blob
  kZstd,  // one zstd frame (format/zstd_reader.h)
};

// The descriptor shardpoint writes for kZstd, PyTorch's ZStandard().get_descriptor().
inline constexpr std::string_view kZstdDescriptor = "stream.zstd/1";

// The transform a descriptor list asks for. Throws FormatError "<where>: unknown stream
// transform \"x\" (this build undoes \"stream.zstd/1\")" for any descriptor other than
// zstd version 1.x, and "<where>: expected one stream transform, found N (...)" for a chain.
StreamTransform parse_transforms(const std::vector<std::string>& descriptors, std::string_view where);

// The descriptor list written for `transform` (empty for kNone).
std::vector<std::string> transform_descriptors(StreamTransform transform);

}  // namespace shardpoint::format
