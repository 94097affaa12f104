#include "train/checkpoint_paths.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "shardpoint/error.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/location.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;

bool is_remote(const std::string& path) { return storage::Location::parse(path).is_remote(); }

// Checkpoint names are appended to the root's path, so a URL may not carry "?options".
void check_no_query(const std::string& url) {
  if (!storage::Location::parse(url).query().empty()) {
    throw UsageError(fmt::format("{}: options after '?' are not supported in trainer paths; give the endpoint and "
                                 "credentials through the environment (shardpoint verify --help lists them)",
                                 url));
  }
}

bool is_version_dir_name(const std::string& n) {
  return n.size() > 8 && n.rfind("version_", 0) == 0 && n.find_first_not_of("0123456789", 8) == std::string::npos;
}

}  // namespace

std::string normalize_checkpoint_path(const std::string& path) {
  check_no_query(path);
  return storage::Location::parse(path).absolute().to_string();
}

std::pair<std::string, std::string> parent_and_name(const std::string& path) {
  const storage::Location location = storage::Location::parse(path);
  const std::optional<storage::Location> parent = location.parent();
  if (!parent) throw UsageError(fmt::format("{}: not a checkpoint path", path));
  return {parent->to_string(), location.name()};
}

bool path_exists(const std::string& path) {
  if (!is_remote(path)) return fs::exists(path);
  const auto [parent, name] = parent_and_name(path);
  auto st = storage::open_storage(parent);
  return st->try_stat(name).has_value() || !st->list(name + "/").empty();
}

void remove_path(const std::string& path) {
  if (!is_remote(path)) {
    fs::remove_all(path);
    return;
  }
  const auto [parent, name] = parent_and_name(path);
  auto st = storage::open_storage(parent);
  st->remove_prefix(name + "/");
  st->remove(name);
}

std::optional<StateDictType> checkpoint_kind(const std::string& path) {
  if (!is_remote(path)) {
    if (fs::is_directory(path) && fs::is_regular_file(fs::path(path) / "meta.pt")) return StateDictType::kSharded;
    if (fs::is_regular_file(path)) return StateDictType::kFull;
    return std::nullopt;
  }
  if (storage::open_storage(path)->try_stat("meta.pt")) return StateDictType::kSharded;
  const auto [parent, name] = parent_and_name(path);
  if (storage::open_storage(parent)->try_stat(name)) return StateDictType::kFull;
  return std::nullopt;
}

std::string next_checkpoints_dir(const std::string& root) {
  check_no_query(root);
  int version = 0;
  if (!is_remote(root)) {
    const fs::path logs = fs::path(root) / "lightning_logs";
    if (fs::is_directory(logs)) {
      for (const auto& e : fs::directory_iterator(logs)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && is_version_dir_name(n)) version = std::max(version, std::stoi(n.substr(8)) + 1);
      }
    }
    return normalize_checkpoint_path((logs / fmt::format("version_{}", version) / "checkpoints").string());
  }
  for (const auto& o : storage::open_storage(root)->list("lightning_logs/version_")) {
    const std::string n = o.key.substr(15, o.key.find('/', 15) - 15);
    if (is_version_dir_name(n)) version = std::max(version, std::stoi(n.substr(8)) + 1);
  }
  return storage::Location::parse(root)
      .child(fmt::format("lightning_logs/version_{}/checkpoints", version))
      .to_string();
}

std::string resolve_last_checkpoint(const std::string& root) {
  // key: (version, -v<n> + 1 (0 for plain "last"))
  static const std::regex kName(R"(lightning_logs/version_(\d+)/checkpoints/(last(?:-v(\d+))?[^/]*\.ckpt)(/.*)?)");
  std::map<std::string, std::pair<std::pair<long, long>, std::set<std::string>>> found;  // path -> key, files
  for (const auto& o : storage::open_storage(root)->list("lightning_logs/version_")) {
    std::smatch m;
    if (!std::regex_match(o.key, m, kName)) continue;
    const std::string path = storage::Location::parse(root)
                                 .child("lightning_logs/version_" + m[1].str() + "/checkpoints/" + m[2].str())
                                 .to_string();
    auto& entry = found[path];
    entry.first = {std::stol(m[1].str()), m[3].matched ? std::stol(m[3].str()) + 1 : 0};
    entry.second.insert(m[4].matched ? m[4].str().substr(1) : "");
  }
  std::string best;
  std::pair<long, long> best_key{-1, -1};
  for (const auto& [path, entry] : found) {
    const auto& files = entry.second;
    const bool committed = files.count("") || (files.count("meta.pt") && files.count(".metadata"));
    if (committed && entry.first > best_key) {
      best_key = entry.first;
      best = path;
    }
  }
  return best.empty() ? best : normalize_checkpoint_path(best);
}

}  // namespace shardpoint::train
