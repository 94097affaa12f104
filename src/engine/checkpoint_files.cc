#include "engine/checkpoint_files.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <regex>
#include <system_error>
#include <tuple>

#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::engine {
namespace {

namespace fs = std::filesystem;

// Removes every entry of the local `dir` whose name `doomed` picks; best effort.
template <typename Pred>
std::size_t remove_entries(const fs::path& dir, Pred doomed) {
  std::error_code ec;
  std::size_t removed = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!doomed(it->path().filename().string())) continue;
    std::error_code ignored;  // best effort: the next save tries again
    if (fs::remove_all(it->path(), ignored) > 0 && !ignored) ++removed;
  }
  return removed;
}

}  // namespace

bool is_committed(storage::Storage& storage) {
  return std::all_of(kCommitMarkers.begin(), kCommitMarkers.end(),
                     [&](std::string_view marker) { return storage.try_stat(marker).has_value(); });
}

bool is_committed(const Location& where) {
  if (!where.is_remote()) {
    const fs::path folder(where.to_string());
    return std::all_of(kCommitMarkers.begin(), kCommitMarkers.end(),
                       [&](std::string_view marker) { return fs::is_regular_file(folder / marker); });
  }
  return is_committed(*storage::open_storage(where));
}

Location staging_path(const Location& target, std::string_view tag) {
  const Location location = target.absolute();
  if (location.is_remote()) throw UsageError(target.text() + ": only a local checkpoint is staged beside its folder");
  const std::optional<Location> parent = location.parent();
  if (!parent || location.name().empty()) throw UsageError(target.text() + ": not a checkpoint path");
  const std::string name = "." + location.name() + std::string(kStagingMarker) +
                           std::string(tag.substr(0, std::min(tag.size(), kStagingTagChars)));
  return parent->child(name);
}

bool is_staging_name(std::string_view name) {
  return name.size() > 1 && name[0] == '.' && name.find(kStagingMarker) != std::string_view::npos;
}

std::size_t remove_stale_staging_of(const Location& target) {
  const Location location = target.absolute();
  const std::optional<Location> parent = location.parent();
  if (location.is_remote() || !parent || location.name().empty()) return 0;
  const std::string prefix = "." + location.name() + std::string(kStagingMarker);
  return remove_entries(parent->to_string(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

std::size_t remove_stale_staging(const Location& dir) {
  if (dir.is_remote()) return 0;
  return remove_entries(dir.to_string(), [](const std::string& n) {
    return is_staging_name(n) || n.find(storage::kTempMarker) != std::string::npos;
  });
}

std::vector<Location> list_committed_checkpoints(const Location& folder) {
  const Location location = folder.absolute();
  if (location.is_remote()) throw UsageError(folder.text() + ": listing checkpoints needs a local folder");
  static const std::regex kStep(R"(step=(\d+))");
  // (step, meta.pt's modification time, name)
  std::vector<std::tuple<long long, fs::file_time_type, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(location.to_string(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_directory() || !is_committed(location.child(name))) continue;
    std::smatch m;
    const long long step = std::regex_search(name, m, kStep) ? std::stoll(m[1].str()) : -1;
    std::error_code time_ec;  // removed meanwhile: sorts first, as an unknown time
    const fs::file_time_type modified = fs::last_write_time(it->path() / kLightningMetaName, time_ec);
    found.emplace_back(step, time_ec ? fs::file_time_type::min() : modified, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<Location> out;
  out.reserve(found.size());
  for (const auto& entry : found) out.push_back(location.child(std::get<2>(entry)));
  return out;
}

void remove_checkpoint(const Location& where) {
  const Location location = where.absolute();
  if (!location.is_remote()) {
    const fs::path path(location.to_string());
    std::error_code ec;
    if (fs::is_directory(path)) {
      for (auto marker = kCommitMarkers.rbegin(); marker != kCommitMarkers.rend(); ++marker) {
        if (fs::remove(path / *marker, ec); ec) throw_os_error("remove", (path / *marker).string(), ec.value());
      }
    }
    if (fs::remove_all(path, ec); ec) throw_os_error("remove", path.string(), ec.value());
    return;
  }
  const std::optional<Location> parent = location.parent();
  if (!parent || location.name().empty()) throw UsageError(where.text() + ": not a checkpoint path");
  const std::unique_ptr<storage::Storage> folder = storage::open_storage(location);
  for (auto marker = kCommitMarkers.rbegin(); marker != kCommitMarkers.rend(); ++marker) folder->remove(*marker);
  folder->remove_all();
  storage::open_storage(*parent)->remove(location.name());  // a single-file checkpoint
}

}  // namespace shardpoint::engine
