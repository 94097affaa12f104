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

bool is_remote(const std::string& path) { return Location::parse(path).is_remote(); }

// Checkpoint names are appended to the root's path, so a URL may not carry "?options".
void check_no_query(const std::string& url) {
  if (!Location::parse(url).query().empty()) {
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
  return Location::parse(path).absolute().to_string();
}

std::pair<std::string, std::string> parent_and_name(const std::string& path) {
  const Location location = Location::parse(path);
  const std::optional<Location> parent = location.parent();
  if (!parent) throw UsageError(fmt::format("{}: not a checkpoint path", path));
  return {parent->to_string(), location.name()};
}

std::unique_ptr<torchfile::TorchFile> open_torch_file(const std::string& dir, const std::string& name) {
  const std::shared_ptr<storage::Storage> st = storage::open_storage(dir);
  return engine::open_torch_file_naming_crc([&] { return st->open_source(name); }, dir + "/" + name, true);
}

bool path_exists(const std::string& path) {
  if (!is_remote(path)) return fs::exists(path);
  const auto [parent, name] = parent_and_name(path);
  auto st = storage::open_storage(parent);
  return st->try_stat(name).has_value() || !st->list(name + "/").empty();
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
  return Location::parse(root).child(fmt::format("lightning_logs/version_{}/checkpoints", version)).to_string();
}

namespace {

// One checkpoint name found under a root, with the files seen under it.
struct Candidate {
  std::string path;  // normalised
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
  const auto [dir, name] =
      c.sharded() ? std::pair<std::string, std::string>{c.path, "meta.pt"} : parent_and_name(c.path);
  const std::unique_ptr<torchfile::TorchFile> tf = open_torch_file(dir, name);
  engine::TorchFileCrc(*tf, dir + "/" + name).check_small_records();
  const pickle::ValuePtr step = tf->root()->get("global_step");
  if (!step) throw FormatError(fmt::format("{}: checkpoint has no \"global_step\"", c.path));
  return step->as_int();
}

}  // namespace

LastCheckpoint resolve_last_checkpoint(const std::string& root) {
  // version, checkpoint name (not hidden), what lies under it
  static const std::regex kName(R"(lightning_logs/version_(\d+)/checkpoints/([^./][^/]*\.ckpt)(/.*)?)");
  static const std::regex kLast(R"(last(?:-v(\d+))?.*\.ckpt)");
  static const std::regex kVersioned(R"(.*-v(\d+)\.ckpt)");
  const Location base = Location::parse(root);
  std::map<std::string, Candidate> found;  // by path
  for (const auto& o : storage::open_storage(root)->list("lightning_logs/version_")) {
    std::smatch m;
    if (!std::regex_match(o.key, m, kName)) continue;
    const std::string name = m[2].str();
    const std::string path = base.child("lightning_logs/version_" + m[1].str() + "/checkpoints/" + name).to_string();
    Candidate& c = found[path];
    if (c.path.empty()) {
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
  if (!newest_last) {
    out.note = fmt::format("no last*.ckpt under {}; resuming from {} (global_step {}), the newest committed checkpoint",
                           root, out.path, step);
  } else if (!newest_last->committed()) {
    out.note = fmt::format("{} is not committed (its save did not finish); resuming from {} (global_step {}), the "
                           "newest committed checkpoint",
                           newest_last->path, out.path, step);
  } else if (last_step >= 0) {
    out.note = fmt::format("{} holds global_step {} (its replacement did not finish); resuming from {} (global_step "
                           "{}), the newest committed checkpoint",
                           newest_last->path, last_step, out.path, step);
  } else {
    out.note = fmt::format("{} is in an older version folder; resuming from {} (global_step {}), the newest committed "
                           "checkpoint",
                           newest_last->path, out.path, step);
  }
  return out;
}

std::string staging_path_for(const std::string& path, std::int64_t step) {
  return engine::staging_path(path, std::to_string(step));
}

std::vector<std::string> local_checkpoints_dirs(const std::string& root) {
  std::vector<std::string> out;
  if (is_remote(root)) return out;
  const fs::path logs = fs::path(root) / "lightning_logs";
  std::error_code ec;
  for (fs::directory_iterator it(logs, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path() / "checkpoints";
    if (is_version_dir_name(it->path().filename().string()) && fs::is_directory(dir)) out.push_back(dir.string());
  }
  return out;
}

}  // namespace shardpoint::train
