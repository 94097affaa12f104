#include "engine/shard_read_ahead.h"

#include <fcntl.h>

#include <algorithm>
#include <utility>

namespace shardpoint::engine {

ShardReadAhead::ShardReadAhead(const format::Metadata& md, std::string folder) : md_(md), folder_(std::move(folder)) {}

void ShardReadAhead::advise_range(const std::string& file, std::uint64_t start, std::uint64_t end) {
  auto fd = fds_.find(file);
  if (fd == fds_.end()) {
    int raw = ::open((folder_ + "/" + file).c_str(), O_RDONLY | O_CLOEXEC);
    fd = fds_.emplace(file, UniqueFd(raw, file)).first;
  }
  if (fd->second.valid()) {
    ::posix_fadvise(fd->second.get(), static_cast<off_t>(start), static_cast<off_t>(end - start), POSIX_FADV_WILLNEED);
  }
}

void ShardReadAhead::advise(const std::vector<std::string>& fqns) {
  if (fqns.empty()) return;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> pending;  // file -> [start, end)
  MutexLock lock(mu_);
  for (const std::string& fqn : fqns) {
    auto it = md_.state_dict_metadata.find(fqn);
    if (it == md_.state_dict_metadata.end()) continue;
    const auto* t = std::get_if<format::TensorStorageMetadata>(&it->second);
    if (t == nullptr) continue;
    for (const auto& chunk : t->chunks) {
      auto info = md_.storage_data.find(format::MetadataIndex{fqn, chunk.offsets, std::nullopt});
      if (info == md_.storage_data.end()) continue;
      const format::StorageInfo& si = info->second;
      auto [range, fresh] = pending.try_emplace(si.relative_path, si.offset, si.offset + si.length);
      if (fresh) continue;
      auto& [start, end] = range->second;
      if (si.offset + si.length >= start && si.offset <= end + (std::uint64_t{1} << 20)) {
        start = std::min(start, si.offset);
        end = std::max(end, si.offset + si.length);
      } else {
        advise_range(si.relative_path, start, end);
        range->second = {si.offset, si.offset + si.length};
      }
    }
  }
  for (const auto& [file, range] : pending) advise_range(file, range.first, range.second);
}

}  // namespace shardpoint::engine
