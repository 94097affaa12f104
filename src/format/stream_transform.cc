#include "format/stream_transform.h"

#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

bool is_zstd_v1(std::string_view d) {
  const std::size_t slash = d.find('/');
  if (slash == std::string_view::npos || d.substr(0, slash) != "stream.zstd") return false;
  const std::string_view version = d.substr(slash + 1);
  return version.substr(0, version.find('.')) == "1";
}

}  // namespace

StreamTransform parse_transforms(const std::vector<std::string>& descriptors, std::string_view where) {
  for (const std::string& d : descriptors) {
    if (!is_zstd_v1(d)) {
      throw FormatError(std::string(where) + ": unknown stream transform \"" + d + "\" (this build undoes \"" +
                        std::string(kZstdDescriptor) + "\")");
    }
  }
  if (descriptors.empty()) return StreamTransform::kNone;
  if (descriptors.size() > 1) {
    std::string list;
    for (const std::string& d : descriptors) list += (list.empty() ? "\"" : ", \"") + d + "\"";
    throw FormatError(std::string(where) + ": expected one stream transform, found " +
                      std::to_string(descriptors.size()) + " (" + list + ")");
  }
  return StreamTransform::kZstd;
}

std::vector<std::string> transform_descriptors(StreamTransform transform) {
  if (transform == StreamTransform::kZstd) return {std::string(kZstdDescriptor)};
  return {};
}

}  // namespace shardpoint::format
