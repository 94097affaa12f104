#include "train/checkpoint_paths.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>

#include <fmt/format.h>

#include "engine/checkpoint_files.h"
#include "engine/torch_file_crc.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "torchfile/torch_file.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;

// Checkpoint names are appended to the root's path, so a URL may not carry "?options".
void check_no_query(const Location& url) {
  if (!url.query().empty()) {
    throw UsageError(fmt::format("{}: options after '?' are not supported in trainer paths; give the endpoint and "
                                 "credentials through the environment (shardpoint verify --help lists them)",
                                 url.text()));
  }
}

bool is_version_dir_name(const std::string& n) {
  return n.size() > 8 && n.rfind("version_", 0) == 0 && n.find_first_not_of("0123456789", 8) == std::string::npos;
}

}  // namespace

Location normalize_checkpoint_path(const Location& path) {
  check_no_query(path);
  return path.absolute();
}

std::pair<Location, std::string> parent_and_name(const Location& path) {
  std::optional<Location> parent = path.parent();
  if (!parent) throw UsageError(fmt::format("{}: not a checkpoint path", path.text()));
  return {std::move(*parent), path.name()};
}

std::unique_ptr<torchfile::TorchFile> open_torch_file(const Location& dir, const std::string& name) {
  const std::shared_ptr<storage::Storage> st = storage::open_storage(dir);
  return engine::open_torch_file_naming_crc([&] { return st->open_source(name); }, dir.child(name).to_string(), true);
}

bool path_exists(const Location& path) {
  if (!path.is_remote()) return fs::exists(path.to_string());
  const auto [parent, name] = parent_and_name(path);
  auto st = storage::open_storage(parent);
  return st->try_stat(name).has_value() || !st->list(name + "/").empty();
}

std::optional<StateDictType> checkpoint_kind(const Location& path) {
  if (!path.is_remote()) {
    const fs::path local(path.to_string());
    if (fs::is_directory(local) && fs::is_regular_file(local / "meta.pt")) return StateDictType::kSharded;
    if (fs::is_regular_file(local)) return StateDictType::kFull;
    return std::nullopt;
  }
  if (storage::open_storage(path)->try_stat("meta.pt")) return StateDictType::kSharded;
  const auto [parent, name] = parent_and_name(path);
  if (storage::open_storage(parent)->try_stat(name)) return StateDictType::kFull;
  return std::nullopt;
}

Location next_checkpoints_dir(const Location& root) {
  check_no_query(root);
  int version = 0;
  if (!root.is_remote()) {
    const fs::path logs = fs::path(root.to_string()) / "lightning_logs";
    if (fs::is_directory(logs)) {
      for (const auto& e : fs::directory_iterator(logs)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && is_version_dir_name(n)) version = std::max(version, std::stoi(n.substr(8)) + 1);
      }
    }
  } else {
    for (const auto& o : storage::open_storage(root)->list("lightning_logs/version_")) {
      const std::string n = o.key.substr(15, o.key.find('/', 15) - 15);
      if (is_version_dir_name(n)) version = std::max(version, std::stoi(n.substr(8)) + 1);
    }
  }
  return normalize_checkpoint_path(root.child(fmt::format("lightning_logs/version_{}/checkpoints", version)));
}

namespace {

// One checkpoint name found under a root, with the files seen under it.
struct Candidate {
  Location path;     // normalised
  std::string name;  // e.g. "last-v1.ckpt"
  long version = 0;
  bool is_last = false;
  long v = 0;                   // -v<n> + 1, 0 without a -v suffix
  std::set<std::string> files;  // "" for an object/file at the name itself

  bool committed() const {
    return files.count("") > 0 || std::all_of(engine::kCommitMarkers.begin(), engine::kCommitMarkers.end(),
                                              [&](std::string_view m) { return files.count(std::string(m)) > 0; });
  }
  bool sharded() const { return files.count("meta.pt") > 0; }
};

// The global_step of a committed candidate, read from its meta.pt (sharded) or the file
// itself. It decides which checkpoint is resumed, so data.pkl's zip CRC-32 is checked: a
// damaged step that still parses must not pick the wrong one (FormatError naming the file).
std::int64_t global_step_of(const Candidate& c) {
  const auto [dir, name] = c.sharded() ? std::pair<Location, std::string>{c.path, "meta.pt"} : parent_and_name(c.path);
  const std::unique_ptr<torchfile::TorchFile> tf = open_torch_file(dir, name);
  engine::TorchFileCrc(*tf, dir.child(name).to_string()).check_small_records();
  const pickle::ValuePtr step = tf->root()->get("global_step");
  if (!step) throw FormatError(fmt::format("{}: checkpoint has no \"global_step\"", c.path.to_string()));
  return step->as_int();
}

}  // namespace

LastCheckpoint resolve_last_checkpoint(const Location& root) {
  // version, checkpoint name (not hidden), what lies under it
  static const std::regex kName(R"(lightning_logs/version_(\d+)/checkpoints/([^./][^/]*\.ckpt)(/.*)?)");
  static const std::regex kLast(R"(last(?:-v(\d+))?.*\.ckpt)");
  static const std::regex kVersioned(R"(.*-v(\d+)\.ckpt)");
  std::map<std::string, Candidate> found;  // by path
  for (const auto& o : storage::open_storage(root)->list("lightning_logs/version_")) {
    std::smatch m;
    if (!std::regex_match(o.key, m, kName)) continue;
    const std::string name = m[2].str();
    const Location path = root.child("lightning_logs/version_" + m[1].str() + "/checkpoints/" + name);
    Candidate& c = found[path.to_string()];
    if (c.name.empty()) {
      c.path = path;
      c.name = name;
      c.version = std::stol(m[1].str());
      std::smatch n;
      c.is_last = std::regex_match(name, n, kLast);
      if (c.is_last && n[1].matched) c.v = std::stol(n[1].str()) + 1;
      if (!c.is_last && std::regex_match(name, n, kVersioned)) c.v = std::stol(n[1].str()) + 1;
    }
    c.files.insert(m[3].matched ? m[3].str().substr(1) : "");
  }
  const Candidate* newest_last = nullptr;  // committed or not
  long newest_version = -1;                // of the committed checkpoints
  for (const auto& [path, c] : found) {
    if (c.is_last && (!newest_last || std::pair(c.version, c.v) > std::pair(newest_last->version, newest_last->v))) {
      newest_last = &c;
    }
    if (c.committed()) newest_version = std::max(newest_version, c.version);
  }
  // The newest committed checkpoint of the newest version folder that has one.
  const Candidate* best = nullptr;
  std::tuple<std::int64_t, bool, long> best_key{-1, false, -1};
  std::int64_t last_step = -1;  // newest_last's, when committed and read
  for (const auto& [path, c] : found) {
    if (!c.committed() || c.version != newest_version) continue;
    const std::int64_t step = global_step_of(c);
    if (&c == newest_last) last_step = step;
    const std::tuple<std::int64_t, bool, long> key{step, c.is_last, c.v};
    if (!best || key > best_key) {
      best = &c;
      best_key = key;
    }
  }
  LastCheckpoint out;
  if (!best) return out;
  out.path = normalize_checkpoint_path(best->path);
  if (best == newest_last) return out;
  const std::int64_t step = std::get<0>(best_key);
  const std::string& resumed = out.path->to_string();
  if (!newest_last) {
    out.note = fmt::format("no last*.ckpt under {}; resuming from {} (global_step {}), the newest committed checkpoint",
                           root.to_string(), resumed, step);
  } else if (!newest_last->committed()) {
    out.note = fmt::format("{} is not committed (its save did not finish); resuming from {} (global_step {}), the "
                           "newest committed checkpoint",
                           newest_last->path.to_string(), resumed, step);
  } else if (last_step >= 0) {
    out.note = fmt::format("{} holds global_step {} (its replacement did not finish); resuming from {} (global_step "
                           "{}), the newest committed checkpoint",
                           newest_last->path.to_string(), last_step, resumed, step);
  } else {
    out.note = fmt::format("{} is in an older version folder; resuming from {} (global_step {}), the newest committed "
                           "checkpoint",
                           newest_last->path.to_string(), resumed, step);
  }
  return out;
}

Location staging_path_for(const Location& path, std::int64_t step) {
  return engine::staging_path(path, std::to_string(step));
}

std::vector<Location> local_checkpoints_dirs(const Location& root) {
  std::vector<Location> out;
  if (root.is_remote()) return out;
  const Location logs = root.child("lightning_logs");
  std::error_code ec;
  for (fs::directory_iterator it(logs.to_string(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string version = it->path().filename().string();
    if (is_version_dir_name(version) && fs::is_directory(it->path() / "checkpoints")) {
      out.push_back(logs.child(version + "/checkpoints"));
    }
  }
  return out;
}

}  // namespace shardpoint::train
