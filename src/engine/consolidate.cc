#include "engine/consolidate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/buffer_pool.h"
#include "core/error.h"
#include "core/unique_fd.h"
#include "engine/checkpoint_reader.h"
#include "engine/flatten.h"
#include "engine/item_reader.h"
#include "engine/load_plan.h"
#include "engine/reshard.h"
#include "format/metadata_codec.h"
#include "format/checkpoint_path.h"
#include "format/safetensors_writer.h"
#include "storage/local_storage.h"
#include "storage/storage_registry.h"
#include "storage/storage_wrapper.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr const char* kMetaPt = "meta.pt";
constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";
constexpr std::size_t kPage = 4096;
// Tensors whose blobs are announced to the kernel (WILLNEED) ahead of the one being read.
constexpr std::size_t kReadAheadTensors = 16;
// The slab is split into this many buffers, filled by kReaderThreads threads while this
// thread writes the filled ones in order: reads overlap writes and each other (more
// requests in flight on a cold disk or an object store).
constexpr std::size_t kSlabBuffers = 4;
// (One when the budget is small: each reader holds checksum-block scratch.)
constexpr std::size_t kReaderThreads = 2;

// Where the bytes of one output tensor come from.
struct TensorSource {
  bool from_meta = false;
  std::string fqn;                        // DCP tensor
  torchfile::TensorInfo meta;             // meta.pt tensor
  DType dtype = DType::kFloat32;
  Shape shape;
  std::uint64_t nbytes() const {
    std::uint64_t n = dtype_itemsize(dtype);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

// A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"), 0 when unavailable.
std::uint64_t proc_status_bytes(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kib = 0;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, n) == 0) {
      kib = std::strtoull(line + n, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

bool path_exists(const std::string& p, struct stat* st) { return ::stat(p.c_str(), st) == 0; }

std::string parent_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// os.path.splitext(basename)[0]: torch.save's archive folder name for a path.
std::string archive_name_for(const std::string& output) {
  std::string base = base_of(output);
  std::size_t lead = 0;
  while (lead < base.size() && base[lead] == '.') ++lead;
  auto dot = base.find_last_of('.');
  if (dot != std::string::npos && dot >= lead) base = base.substr(0, dot);
  for (unsigned char c : base) {
    if (c >= 0x80) return "archive";  // newer torch falls back to a stream for non-ASCII names
  }
  return base.empty() ? "archive" : base;
}

// ---------------------------------------------------------------------------------------
// Locations: a local path, or a storage URL (s3://, gs://, az://, abfs://, memory://;
// anything storage::open_storage() knows): is_storage_url(), as for inspect, verify and
// reshard. "file://" URLs are local paths.

// A URL split as "<scheme>://<authority>" / "<path>" / "?<query>"; path has no empty or
// "." segments and no leading or trailing '/'.
struct UrlParts {
  std::string head;
  std::string path;
  std::string query;
  std::string join() const { return head + (path.empty() ? "" : "/" + path) + query; }
};

UrlParts split_url(const std::string& url) {
  UrlParts parts;
  std::string rest = url;
  if (auto q = rest.find('?'); q != std::string::npos) {
    parts.query = rest.substr(q);
    rest.resize(q);
  }
  std::size_t authority = rest.find("://") + 3;
  std::size_t slash = rest.find('/', authority);
  parts.head = rest.substr(0, slash);
  if (slash != std::string::npos) {
    std::string path = normalize_path("/" + rest.substr(slash + 1));
    parts.path = path == "/" ? "" : path.substr(1);
  }
  return parts;
}

// A local path in pathlib's form (file:// stripped), or a URL with a normalized path.
std::string normalize_location(const std::string& location) {
  if (is_storage_url(location)) return split_url(location).join();
  return normalize_path(location.starts_with("file://") ? location.substr(7) : location);
}

// split_object_url() of a normalized URL: "s3://b/p/out.pt?x=y" -> {"s3://b/p?x=y",
// "out.pt"}. Throws UsageError for a bucket root.
std::pair<std::string, std::string> split_parent_url(const std::string& url, const char* what) {
  std::optional<ObjectUrl> object = split_object_url(url);
  if (!object) {
    throw UsageError(std::string(what) + " \"" + url + "\" names a bucket or container, not an object under it");
  }
  return {std::move(object->parent), std::move(object->key)};
}

// "<location>.consolidated" (Lightning's default output), the suffix on the URL's path.
std::string default_output_for(const std::string& folder) {
  if (!is_storage_url(folder)) return folder + ".consolidated";
  UrlParts parts = split_url(folder);
  if (parts.path.empty()) {
    throw UsageError("the checkpoint \"" + folder + "\" is a bucket root: give --output_file");
  }
  parts.path += ".consolidated";
  return parts.join();
}

// ---------------------------------------------------------------------------------------
// Windowed sources: the zip and pickle parsers read each blob's headers with bursts of
// small reads at both of its ends (~15 per blob). Served from a few shared windows, they
// cost one read per window instead of one system call or HTTP request each, and memory
// does not grow with the number of shard files (the remote drivers' own sources keep a
// cache per file). Reads of at least half a window go straight to the storage, into the
// caller's buffer.

class WindowCache {
 public:
  static constexpr std::size_t kWindowBytes = std::size_t{128} << 10;
  static constexpr std::size_t kWindows = 8;
  static constexpr std::size_t kBytes = kWindowBytes * kWindows;

  // Fills out from the window of object `key` (read through `inner`) that holds [offset,
  // offset + out.size()), reading the window when it is not cached. Returns false when the
  // range crosses a window boundary.
  bool read(const ByteSource& inner, const std::string& key, std::uint64_t offset, std::span<std::byte> out,
            std::string_view what) {
    const std::uint64_t start = offset / kWindowBytes * kWindowBytes;
    if (offset + out.size() > start + kWindowBytes) return false;
    std::lock_guard lock(mu_);
    Window* w = nullptr;
    for (Window& c : windows_) {
      if (c.start == start && c.key == key) w = &c;
    }
    if (w == nullptr) {
      if (windows_.size() < kWindows) windows_.emplace_back();
      w = &windows_[next_++ % windows_.size()];
      w->key.clear();  // stays invalid if the read throws
      w->bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kWindowBytes, inner.size() - start)));
      inner.read(start, w->bytes, what);
      w->key = key;
      w->start = start;
    }
    std::memcpy(out.data(), w->bytes.data() + (offset - start), out.size());
    return true;
  }

 private:
  struct Window {
    std::string key;
    std::uint64_t start = 0;
    std::vector<std::byte> bytes;
  };
  std::mutex mu_;
  std::vector<Window> windows_;
  std::size_t next_ = 0;
};

// A whole object read with ranged Storage::read calls (remote drivers: one GET each, into
// the caller's buffer).
class RangedReadSource final : public ByteSource {
 public:
  RangedReadSource(std::shared_ptr<storage::Storage> st, std::string key, std::uint64_t size)
      : st_(std::move(st)), key_(std::move(key)), name_(st_->describe_key(key_)), size_(size) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (!out.empty()) st_->read(key_, offset, out);
  }

 private:
  std::shared_ptr<storage::Storage> st_;
  std::string key_;
  std::string name_;
  std::uint64_t size_;
};

class WindowedSource final : public ByteSource {
 public:
  WindowedSource(std::shared_ptr<const ByteSource> inner, std::string key, std::shared_ptr<WindowCache> cache)
      : inner_(std::move(inner)), key_(std::move(key)), cache_(std::move(cache)) {}
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t size() const override { return inner_->size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (out.empty()) return;
    if (out.size() < WindowCache::kWindowBytes / 2 && cache_->read(*inner_, key_, offset, out, what)) return;
    inner_->read(offset, out, what);
  }

 private:
  std::shared_ptr<const ByteSource> inner_;
  std::string key_;
  std::shared_ptr<WindowCache> cache_;
};

// The input storage as CheckpointReader sees it: every source is a WindowedSource, over a
// pread source (local files, never mapped: mapped pages would count in our RSS) or over
// ranged reads (object stores).
class WindowedInputStorage final : public storage::StorageWrapper {
 public:
  explicit WindowedInputStorage(std::shared_ptr<storage::Storage> target)
      : StorageWrapper(target), target_(std::move(target)), cache_(std::make_shared<WindowCache>()) {}
  std::unique_ptr<ByteSource> open_source(std::string_view key, const storage::SourceOptions&,
                                          const storage::IoOptions& io) override {
    std::shared_ptr<const ByteSource> inner;
    if (target_->features().local_path) {
      storage::SourceOptions pread;
      pread.prefer_mmap = false;
      inner = target_->open_source(key, pread, io);
    } else {
      inner = std::make_shared<RangedReadSource>(target_, std::string(key), target_->stat(key, io));
    }
    return std::make_unique<WindowedSource>(std::move(inner), std::string(key), cache_);
  }

 private:
  std::shared_ptr<storage::Storage> target_;
  std::shared_ptr<WindowCache> cache_;
};

// The fqns of the checkpoint in `order` (Metadata::key_order: the order the file lists
// them, in which PyTorch's _EmptyStateDictLoadPlanner builds and dcp_to_torch_save writes
// the state), then any others sorted.
std::vector<std::string> ordered_fqns(const format::Metadata& md, const std::vector<std::string>& order) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& fqn : order) {
    if (md.state_dict_metadata.count(fqn) && seen.insert(fqn).second) out.push_back(fqn);
  }
  for (const auto& [fqn, _] : md.state_dict_metadata) {
    if (seen.insert(fqn).second) out.push_back(fqn);
  }
  return out;
}

format::ObjectPath path_of(const format::Metadata& md, const std::string& fqn) {
  auto it = md.planner_data.find(fqn);
  if (it != md.planner_data.end() && !it->second.empty()) return it->second;
  return format::ObjectPath{fqn};
}

bool holds_persistent_id(const Value& v, std::unordered_set<const Value*>& seen) {
  if (!seen.insert(&v).second) return false;
  if (v.is(Kind::kPersistentId)) return true;
  auto check = [&](const ValuePtr& p) { return p && holds_persistent_id(*p, seen); };
  switch (v.kind()) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet:
      for (const auto& i : v.items()) {
        if (check(i)) return true;
      }
      return false;
    case Kind::kDict:
      for (const auto& [k, x] : v.entries()) {
        if (check(k) || check(x)) return true;
      }
      return false;
    case Kind::kObject:
      return check(v.callable()) || check(v.args()) || check(v.kwargs()) || check(v.state());
    default:
      return false;
  }
}

// Calls fn on every child slot of v (dict keys and values, items; the children of an
// object's callable/args/kwargs/state containers).
template <typename Fn>
void for_each_child_slot(Value& v, Fn&& fn) {
  switch (v.kind()) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet:
      for (auto& i : v.mutable_items()) fn(i);
      break;
    case Kind::kDict:
      for (auto& [k, x] : v.mutable_entries()) {
        fn(k);
        fn(x);
      }
      break;
    default:
      break;
  }
}

// Replaces the tensor nodes of meta.pt's tree by placeholders registered in `sources`.
class MetaTensorReplacer {
 public:
  MetaTensorReplacer(const torchfile::TorchFile& file, std::vector<TensorSource>& sources,
                     std::unordered_map<const Value*, std::size_t>& placeholders)
      : file_(file), sources_(sources), placeholders_(placeholders) {}

  void replace(ValuePtr& slot) {
    if (!slot) return;
    if (const torchfile::TensorInfo* info = file_.tensor_of(*slot)) {
      auto done = replaced_.find(slot.get());
      if (done != replaced_.end()) {
        slot = done->second;
        return;
      }
      TensorSource src;
      src.from_meta = true;
      src.meta = *info;
      src.dtype = info->dtype;
      src.shape = info->shape;
      ValuePtr placeholder = Value::tuple({Value::str("meta.pt tensor")});
      placeholders_.emplace(placeholder.get(), sources_.size());
      sources_.push_back(std::move(src));
      keep_.push_back(slot);
      replaced_.emplace(slot.get(), placeholder);
      slot = placeholder;
      return;
    }
    if (!visited_.insert(slot.get()).second) return;
    Value& v = *slot;
    if (v.is(Kind::kObject)) {
      for (const ValuePtr* p : {&v.callable(), &v.args(), &v.kwargs(), &v.state()}) {
        if (*p) for_each_child_slot(**p, [&](ValuePtr& s) { replace(s); });
      }
      return;
    }
    for_each_child_slot(v, [&](ValuePtr& s) { replace(s); });
  }

 private:
  const torchfile::TorchFile& file_;
  std::vector<TensorSource>& sources_;
  std::unordered_map<const Value*, std::size_t>& placeholders_;
  std::unordered_map<const Value*, ValuePtr> replaced_;
  std::unordered_set<const Value*> visited_;
  std::vector<ValuePtr> keep_;
};

// Index of the str key `key` in a dict's entries, or -1.
std::ptrdiff_t find_key(const pickle::DictEntries& entries, const std::string& key) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ValuePtr& k = entries[i].first;
    if (k && k->is(Kind::kStr) && k->as_string() == key) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

// checkpoint[key] = value (in place when present, appended otherwise).
void assign_key(pickle::DictEntries& entries, const std::string& key, ValuePtr value) {
  std::ptrdiff_t i = find_key(entries, key);
  if (i >= 0) {
    entries[static_cast<std::size_t>(i)].second = std::move(value);
  } else {
    entries.emplace_back(Value::str(key), std::move(value));
  }
}

ValuePtr pop_key(pickle::DictEntries& entries, const std::string& key) {
  std::ptrdiff_t i = find_key(entries, key);
  if (i < 0) return nullptr;
  ValuePtr v = entries[static_cast<std::size_t>(i)].second;
  entries.erase(entries.begin() + i);
  return v;
}

// re.match("optimizer_[0-9]+", key): a prefix match.
bool matches_optimizer_prefix(const std::string& key) {
  constexpr std::string_view kPrefix = "optimizer_";
  return key.size() > kPrefix.size() && key.compare(0, kPrefix.size(), kPrefix) == 0 &&
         key[kPrefix.size()] >= '0' && key[kPrefix.size()] <= '9';
}

// Lightning's _format_checkpoint (lightning-behaviour.md §7.4).
void apply_trainer_layout(pickle::DictEntries& entries) {
  ValuePtr model = pop_key(entries, "model");
  if (!model) {
    throw PlanError(
        "the checkpoint has no \"model\" key, which Lightning's Trainer consolidation renames to \"state_dict\" "
        "(Lightning raises KeyError: 'model'); use --layout fabric to keep the keys as saved");
  }
  assign_key(entries, "state_dict", std::move(model));
  std::size_t n = 0;
  for (const auto& [k, v] : entries) {
    if (k && k->is(Kind::kStr) && matches_optimizer_prefix(k->as_string())) ++n;
  }
  if (n == 0) return;
  std::vector<ValuePtr> states;
  for (std::size_t i = 0; i < n; ++i) {
    std::string key = "optimizer_" + std::to_string(i);
    ValuePtr v = pop_key(entries, key);
    if (!v) {
      throw PlanError("the checkpoint has " + std::to_string(n) + " keys matching optimizer_[0-9]+ but no \"" + key +
                      "\" (Lightning raises KeyError: '" + key + "')");
    }
    states.push_back(std::move(v));
  }
  assign_key(entries, "optimizer_states", Value::list(std::move(states)));
}

// A temporary folder next to the output, removed unless published.
class TempFolder {
 public:
  explicit TempFolder(const std::string& output)
      : output_(output), path_(parent_of(output) + "/." + base_of(output) + ".sp-tmp." + std::to_string(::getpid())) {
    std::error_code ec;
    fs::remove_all(path_, ec);
    if (::mkdir(path_.c_str(), 0777) != 0) throw_os_error("mkdir", path_, errno);
  }
  ~TempFolder() {
    if (!published_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }

  // rename + fsync of the parent folder.
  void publish(bool durable) {
    if (::rename(path_.c_str(), output_.c_str()) != 0) throw_os_error("rename", path_ + " -> " + output_, errno);
    published_ = true;
    if (durable) {
      int fd = ::open(parent_of(output_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) {
        UniqueFd dir(fd, parent_of(output_));
        ::fsync(fd);
      }
    }
  }

 private:
  std::string output_;
  std::string path_;
  bool published_ = false;
};

class Consolidator {
 public:
  Consolidator(const ConsolidateOptions& options, const std::function<void(const ConsolidateProgress&)>& progress)
      : options_(options), progress_(progress) {}

  ConsolidateReport run() {
    auto t0 = std::chrono::steady_clock::now();
    output_ = validate_consolidate(options_);
    folder_ = normalize_location(options_.checkpoint_folder);
    remote_in_ = is_storage_url(folder_);
    remote_out_ = is_storage_url(output_);
    if (!remote_out_) check_output_parent();

    std::shared_ptr<storage::Storage> target;
    if (remote_in_) {
      storage::StorageOptions in_options;
      in_options.default_pool_bytes = 4096;  // never writes
      target = storage::open_storage(folder_, in_options);
    } else {
      storage::StorageOptions in_options;
      in_options.max_mmaps = 0;  // pread: mapped shard pages would count in our RSS
      in_options.default_pool_bytes = 4096;
      target = storage::open_local_storage_at(folder_, in_options);
    }
    input_ = std::make_shared<WindowedInputStorage>(target);
    reader_ = std::make_unique<CheckpointReader>(*input_, CheckpointReaderOptions{options_.verify_checksums});
    fqns_ = ordered_fqns(reader_->metadata(), reader_->metadata().key_order);
    check_items();
    plan_memory();

    if (options_.format == ConsolidateFormat::kSafetensors) {
      write_safetensors();
    } else {
      write_torch_save();
    }
    report_.output = output_;
    ReadCounts counts = reader_->counts();
    report_.bytes_read = counts.header_bytes + counts.data_bytes;
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report_.peak_rss_bytes = proc_status_bytes("VmHWM:");
    return report_;
  }

 private:
  // Budget: what the process already holds (code, libraries, metadata, object trees), a
  // reserve (checksum-block scratch, allocator slack, the shared header windows; for object
  // stores the HTTP clients' buffers), then of the rest (at most half the budget) the
  // writer's staging (local: 1/6, at most 2 MiB; object store: 1-4 upload parts) and 2/3 of
  // what remains for the slab buffers.
  void plan_memory() {
    report_.base_rss_bytes = proc_status_bytes("VmRSS:");
    // 5 MiB of slack: code and library pages first touched during the copy (writer, CRC,
    // checksum paths) grow RSS after this measurement; with 3 MiB a 16 MiB budget peaked at
    // 15.0-16.0 MiB.
    std::uint64_t reserve = report_.base_rss_bytes + (std::uint64_t{5} << 20) + WindowCache::kBytes;
    if (remote_in_ || remote_out_) reserve += std::uint64_t{8} << 20;
    std::uint64_t avail = options_.memory_budget > reserve ? options_.memory_budget - reserve : 0;
    avail = std::min<std::uint64_t>(avail, options_.memory_budget / 2);
    // A second reader costs its own scratch and allocator arena: worth it with room to spare.
    constexpr std::uint64_t kReaderCost = std::uint64_t{4} << 20;
    readers_ = avail >= 8 * kReaderCost ? kReaderThreads : 1;
    avail -= (readers_ - 1) * kReaderCost;
    std::uint64_t for_slab = avail;
    if (remote_out_) {
      // Upload parts: S3 needs >= 5 MiB; 8 MiB when at least two fit in a third of `avail`.
      part_bytes_ = avail / 3 >= (std::uint64_t{16} << 20) ? std::size_t{8} << 20 : std::size_t{5} << 20;
      std::uint64_t parts = std::clamp<std::uint64_t>(avail / 3 / part_bytes_, 1, 4);
      pool_bytes_ = static_cast<std::size_t>(parts * part_bytes_);
      for_slab = avail > pool_bytes_ ? avail - pool_bytes_ : 0;
    } else {
      pool_bytes_ = static_cast<std::size_t>(std::clamp<std::uint64_t>(avail / 6, 64 << 10, 2 << 20));
      part_bytes_ = pool_bytes_;
    }
    slab_bytes_ = static_cast<std::size_t>(std::max<std::uint64_t>(for_slab * 2 / 3, 256 << 10));
    buffer_bytes_ = std::max<std::size_t>(slab_bytes_ / kSlabBuffers / kPage * kPage, kPage);
    slab_.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, kSlabBuffers * buffer_bytes_)));
    if (!slab_) throw std::bad_alloc();
    report_.slab_bytes = slab_bytes_;
  }

  void check_cancel() const {
    if (options_.cancel != nullptr && options_.cancel->load() != 0) throw Cancelled();
  }

  void check_output_parent() const {
    std::string parent = parent_of(output_);
    struct stat st {};
    if (!path_exists(parent, &st) || !S_ISDIR(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound,
                         "cannot write \"" + output_ + "\": directory \"" + parent + "\" does not exist");
    }
  }

  // Every file .metadata refers to is a safe relative path, exists and is long enough,
  // checked before anything is written so a broken folder fails early with one line.
  void check_items() {
    std::map<std::string, std::uint64_t> sizes;
    for (const auto& [index, info] : reader_->metadata().storage_data) {
      if (!format::is_safe_relative_path(info.relative_path)) {
        throw FormatError(input_->describe_key(".metadata") + ": item \"" + index.fqn + "\": relative_path '" +
                          info.relative_path + "' escapes the checkpoint folder");
      }
      auto it = sizes.find(info.relative_path);
      if (it == sizes.end()) {
        // Symlinks inside a local folder must not lead out of it (once per file).
        if (!remote_in_) format::resolve_item_path(folder_, info.relative_path);
        it = sizes.emplace(info.relative_path, input_->stat(info.relative_path)).first;
      }
      if (info.offset + info.length > it->second) {
        throw FormatError(input_->describe_key(info.relative_path) + ": item \"" + index.fqn + "\": expected " +
                          std::to_string(info.offset + info.length) + " bytes (offset " + std::to_string(info.offset) +
                          " + length " + std::to_string(info.length) + "), found " + std::to_string(it->second) +
                          " (truncated shard file)");
      }
    }
  }

  ValuePtr placeholder_for(TensorSource src) {
    ValuePtr p = Value::tuple({Value::str(src.fqn)});
    placeholders_.emplace(p.get(), sources_.size());
    sources_.push_back(std::move(src));
    return p;
  }

  // The DCP part as a pickle dict, tensors as placeholders (dcp_to_torch_save's tree).
  ValuePtr build_dcp_tree() {
    const format::Metadata& md = reader_->metadata();
    StateNode root{StateDict{}};
    for (const std::string& fqn : fqns_) {
      const auto& entry = md.state_dict_metadata.at(fqn);
      ValuePtr leaf;
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
        TensorSource src;
        src.fqn = fqn;
        src.dtype = t->properties.dtype;
        src.shape = t->size;
        leaf = placeholder_for(std::move(src));
      } else {
        leaf = reader_->read_object(fqn);
        std::unordered_set<const Value*> seen;
        if (leaf && holds_persistent_id(*leaf, seen)) {
          throw FormatError("item \"" + fqn + "\": an object item that holds tensors is not supported");
        }
        ++report_.objects;
      }
      set_at_path(root, path_of(md, fqn), StateNode(std::move(leaf)));
    }
    return to_pickle_value(root);
  }

  void open_meta() {
    if (remote_in_) {
      meta_ = torchfile::TorchFile::open(input_->open_source(kMetaPt));
    } else {
      meta_ = torchfile::TorchFile::open(folder_ + "/" + kMetaPt);
    }
  }

  ValuePtr build_tree() {
    ValuePtr tree = build_dcp_tree();
    if (options_.layout == ConsolidateLayout::kDcp) return tree;
    open_meta();
    ValuePtr meta_root = meta_->root();
    if (!meta_root || !meta_root->is(Kind::kDict)) {
      throw FormatError(meta_->source().name() + ": expected a dict at the top, found " +
                        std::string(meta_root ? pickle::kind_name(meta_root->kind()) : "nothing"));
    }
    MetaTensorReplacer replacer(*meta_, sources_, placeholders_);
    replacer.replace(meta_root);
    auto& entries = tree->mutable_entries();
    for (const auto& [k, v] : meta_root->entries()) {
      if (k && k->is(Kind::kStr)) {
        assign_key(entries, k->as_string(), v);
      } else {
        entries.emplace_back(k, v);
      }
    }
    if (options_.layout == ConsolidateLayout::kTrainer) apply_trainer_layout(entries);
    return tree;
  }

  // Replaces placeholders by tensor nodes with storage keys "0", "1", ... in the order
  // the pickle writer meets them; fills order_ (source index per key).
  void assign_storages(ValuePtr& slot) {
    if (!slot) return;
    auto ph = placeholders_.find(slot.get());
    if (ph != placeholders_.end()) {
      auto made = made_.find(slot.get());
      if (made != made_.end()) {
        slot = made->second;
        return;
      }
      const TensorSource& src = sources_[ph->second];
      std::string key = std::to_string(order_.size());
      order_.push_back(ph->second);
      std::uint64_t numel = 1;
      for (auto d : src.shape) numel *= static_cast<std::uint64_t>(d);
      auto strides = torchfile::contiguous_strides(src.shape);
      bool requires_grad = src.from_meta && src.meta.requires_grad;
      ValuePtr node = torchfile::make_tensor_node(src.dtype, src.shape, strides, 0, key, numel, "cpu",
                                                  src.from_meta && !src.meta.is_parameter && requires_grad);
      if (src.from_meta && src.meta.is_parameter) node = torchfile::make_parameter_node(node, requires_grad);
      made_.emplace(slot.get(), node);
      keep_.push_back(slot);
      slot = node;
      return;
    }
    if (!visited_.insert(slot.get()).second) return;
    Value& v = *slot;
    if (v.is(Kind::kObject)) {
      for (const ValuePtr* p : {&v.callable(), &v.args(), &v.kwargs(), &v.state()}) {
        if (*p) for_each_child_slot(**p, [&](ValuePtr& s) { assign_storages(s); });
      }
      return;
    }
    for_each_child_slot(v, [&](ValuePtr& s) { assign_storages(s); });
  }

  // The storage the output goes to, rooted at `root` (a local folder or a URL prefix). Its
  // writers stage bytes in one pool sized by plan_memory() (object stores: upload parts).
  std::shared_ptr<storage::Storage> open_output_storage(const std::string& root) {
    storage::StorageOptions out_options;
    BufferPoolOptions pool;
    pool.buffer_bytes = part_bytes_;
    pool.capacity_bytes = pool_bytes_;
    pool.huge_pages = false;
    out_options.buffer_pool = std::make_shared<BufferPool>(pool);
    if (remote_out_) return storage::open_storage(root, out_options);
    return storage::open_local_storage_at(root, out_options);
  }

  // posix_fadvise(WILLNEED) over the saved blobs of sources_[seq[from..to)] (local input);
  // best effort. Adjacent blobs of a file are merged into one call.
  void advise(const std::vector<std::size_t>& seq, std::size_t from, std::size_t to) {
    if (remote_in_ || from >= to) return;
    const format::Metadata& md = reader_->metadata();
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> pending;  // file -> [start, end)
    std::lock_guard lock(advise_mu_);
    auto flush = [&](const std::string& file, std::uint64_t start, std::uint64_t end) {
      auto fd = advise_fds_.find(file);
      if (fd == advise_fds_.end()) {
        int raw = ::open((folder_ + "/" + file).c_str(), O_RDONLY | O_CLOEXEC);
        fd = advise_fds_.emplace(file, UniqueFd(raw, file)).first;
      }
      if (fd->second.valid()) {
        ::posix_fadvise(fd->second.get(), static_cast<off_t>(start), static_cast<off_t>(end - start),
                        POSIX_FADV_WILLNEED);
      }
    };
    for (std::size_t i = from; i < to; ++i) {
      const TensorSource& src = sources_[seq[i]];
      if (src.from_meta) continue;
      auto it = md.state_dict_metadata.find(src.fqn);
      if (it == md.state_dict_metadata.end()) continue;
      const auto* t = std::get_if<format::TensorStorageMetadata>(&it->second);
      if (t == nullptr) continue;
      for (const auto& chunk : t->chunks) {
        auto info = md.storage_data.find(format::MetadataIndex{src.fqn, chunk.offsets, std::nullopt});
        if (info == md.storage_data.end()) continue;
        const format::StorageInfo& si = info->second;
        auto [range, fresh] = pending.try_emplace(si.relative_path, si.offset, si.offset + si.length);
        if (fresh) continue;
        auto& [start, end] = range->second;
        if (si.offset + si.length >= start && si.offset <= end + (std::uint64_t{1} << 20)) {
          start = std::min(start, si.offset);
          end = std::max(end, si.offset + si.length);
        } else {
          flush(si.relative_path, start, end);
          range->second = {si.offset, si.offset + si.length};
        }
      }
    }
    for (const auto& [file, range] : pending) flush(file, range.first, range.second);
  }

  // A run of bytes of the output stream: [at, at + n) (row-major) of sources_[seq[k]], the
  // box (offsets, sizes) of a DCP tensor. `first` / `last`: the tensor starts / ends here.
  struct Piece {
    std::size_t k = 0;
    Shape offsets;
    Shape sizes;
    std::uint64_t at = 0;
    std::uint64_t n = 0;
    std::size_t buffer_offset = 0;  // page-aligned, so O_DIRECT writes need no staging copy
    bool first = false;
    bool last = false;
  };

  // Cuts the sources of seq into batches of pieces that fit one slab buffer, in output
  // order, one box at a time (memory stays independent of the checkpoint's size).
  class BatchPlanner {
   public:
    BatchPlanner(const Consolidator& c, const std::vector<std::size_t>& seq) : c_(c), seq_(seq) {}
    bool exhausted() const { return k_ >= seq_.size(); }

    std::vector<Piece> next() {
      std::vector<Piece> batch;
      std::size_t used = 0;
      while (k_ < seq_.size()) {
        if (!head_) start_source();
        Piece p = *head_;
        std::size_t padded = (used + kPage - 1) / kPage * kPage;
        if (!batch.empty() && padded + p.n > c_.buffer_bytes_) break;
        p.k = k_;
        p.buffer_offset = padded;
        used = padded + static_cast<std::size_t>(p.n);
        Piece following;
        if (p.n > 0 && pull(following)) {
          head_ = std::move(following);
        } else {
          p.last = true;
          head_.reset();
          ++k_;
        }
        batch.push_back(std::move(p));
      }
      return batch;
    }

   private:
    // The first piece of seq[k_]; a tensor without elements is one empty piece (its record
    // is still written).
    void start_source() {
      const TensorSource& src = c_.sources_[seq_[k_]];
      at_ = 0;
      cursor_.reset();
      if (!src.from_meta) cursor_.emplace(src.shape, dtype_itemsize(src.dtype), c_.buffer_bytes_);
      Piece p;
      if (!pull(p)) p = Piece{};
      p.first = true;
      head_ = std::move(p);
    }

    // The next box of seq[k_]: a DCP box, or a byte range of a meta.pt tensor.
    bool pull(Piece& p) {
      const TensorSource& src = c_.sources_[seq_[k_]];
      p = Piece{};
      p.at = at_;
      if (cursor_) {
        if (!cursor_->next(p.offsets, p.sizes, p.n)) return false;
      } else {
        if (at_ >= src.nbytes()) return false;
        p.n = std::min<std::uint64_t>(c_.buffer_bytes_, src.nbytes() - at_);
      }
      at_ += p.n;
      return true;
    }

    const Consolidator& c_;
    const std::vector<std::size_t>& seq_;
    std::size_t k_ = 0;
    std::optional<Piece> head_;  // the next piece of seq[k_], not yet in a batch
    std::optional<BoxCursor> cursor_;
    std::uint64_t at_ = 0;
  };

  // Reads one piece into dest. Called from reader threads.
  void read_piece(const TensorSource& src, const Piece& p, std::span<std::byte> dest) {
    if (p.n == 0) return;
    if (!src.from_meta) {
      reader_->read_box(src.fqn, p.offsets, p.sizes, dest);
      return;
    }
    // meta.pt tensors are small (trainer state); read whole, keep the piece's bytes.
    std::vector<std::byte> bytes(src.meta.nbytes());
    std::lock_guard lock(meta_mu_);
    meta_->read_tensor(src.meta, bytes);
    std::memcpy(dest.data(), bytes.data() + p.at, static_cast<std::size_t>(p.n));
  }

  // Streams the bytes of sources_[seq[0]], sources_[seq[1]], ... (each row-major) to the
  // caller: begin(k) before source seq[k], write(span) for each piece, end(k) after it.
  // The slab is kSlabBuffers buffers; kReaderThreads threads each take a free buffer and
  // the next batch (BatchPlanner) and fill it, while this thread hands the filled buffers
  // to write() in batch order (the output writer: CRC, O_DIRECT pwrite or upload parts).
  // Reads overlap each other and the writes. Exceptions of either side stop both and
  // propagate here.
  void stream_sources(const std::vector<std::size_t>& seq, const std::function<void(std::size_t)>& begin,
                      const std::function<void(std::span<const std::byte>)>& write,
                      const std::function<void(std::size_t)>& end) {
    struct Filled {
      std::size_t buf;
      std::vector<Piece> pieces;
    };
    BatchPlanner planner(*this, seq);
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::size_t, Filled> ready;  // by batch number
    std::vector<std::size_t> free_bufs;
    for (std::size_t b = 0; b < kSlabBuffers; ++b) free_bufs.push_back(b);
    std::size_t claimed = 0;              // batches handed to readers
    std::size_t advised = 0;              // sources announced to the kernel
    bool stop = false;
    std::exception_ptr error;
    auto buffer = [&](std::size_t b) { return slab_.get() + b * buffer_bytes_; };

    auto produce = [&] {
      try {
        while (true) {
          std::size_t buf = 0, batch = 0;
          std::vector<Piece> pieces;
          std::size_t advise_from = 0, advise_to = 0;
          {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return stop || planner.exhausted() || !free_bufs.empty(); });
            if (stop || planner.exhausted()) return;
            buf = free_bufs.back();
            free_bufs.pop_back();
            batch = claimed++;
            pieces = planner.next();
            // Ask the kernel to read the next tensors' blobs ahead (cold caches: thousands
            // of small header reads would otherwise each wait for the disk).
            advise_from = advised;
            advised = std::max(advised, std::min(seq.size(), pieces.back().k + kReadAheadTensors));
            advise_to = advised;
          }
          advise(seq, advise_from, advise_to);
          for (const Piece& p : pieces) {
            read_piece(sources_[seq[p.k]], p,
                       std::span<std::byte>(buffer(buf) + p.buffer_offset, static_cast<std::size_t>(p.n)));
          }
          std::lock_guard lock(mu);
          ready.emplace(batch, Filled{buf, std::move(pieces)});
          cv.notify_all();
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        stop = true;
        cv.notify_all();
      }
    };

    std::vector<std::thread> readers;
    auto finish = [&] {
      {
        std::lock_guard lock(mu);
        stop = true;
        cv.notify_all();
      }
      for (auto& t : readers) t.join();
    };
    try {
      for (std::size_t i = 0; i < readers_; ++i) readers.emplace_back(produce);
      for (std::size_t batch = 0;; ++batch) {
        Filled f;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return ready.count(batch) || error || (planner.exhausted() && batch >= claimed); });
          if (error) std::rethrow_exception(error);
          auto it = ready.find(batch);
          if (it == ready.end()) break;  // every batch written
          f = std::move(it->second);
          ready.erase(it);
        }
        for (const Piece& p : f.pieces) {
          if (p.first) begin(p.k);
          if (p.n > 0) {
            write(std::span<const std::byte>(buffer(f.buf) + p.buffer_offset, static_cast<std::size_t>(p.n)));
          }
          if (p.last) end(p.k);
          done_ += p.n;
        }
        {
          std::lock_guard lock(mu);
          free_bufs.push_back(f.buf);
          cv.notify_all();
        }
        if (progress_) progress_(ConsolidateProgress{done_, total_});
        check_cancel();
      }
    } catch (...) {
      finish();
      throw;
    }
    finish();
  }

  void write_torch_save() {
    ValuePtr tree = build_tree();
    assign_storages(tree);
    for (std::size_t i : order_) total_ += sources_[i].nbytes();
    if (progress_) progress_(ConsolidateProgress{0, total_});

    auto [root, key] = output_root_and_key();
    auto out = open_output_storage(root);
    storage::WriteOptions wo;
    wo.durable = options_.durable;
    auto sink = out->open_writer(key, wo);
    torchfile::TorchSaveOptions so;
    so.archive_name = archive_name_for(key);
    // Records start at page multiples (torch.load takes any alignment; torch.save uses 64),
    // so page-aligned slabs go from our buffer to the O_DIRECT file without a staging copy.
    so.zip.alignment = kPage;
    torchfile::TorchSaveWriter writer(*sink, so);
    writer.write_pickle(*tree);
    stream_sources(
        order_, [&](std::size_t k) { writer.begin_storage(std::to_string(k), sources_[order_[k]].nbytes()); },
        [&](std::span<const std::byte> data) { writer.write(data); },
        [&](std::size_t k) {
          writer.end_storage();
          ++report_.tensors;
          report_.tensor_bytes += sources_[order_[k]].nbytes();
        });
    writer.finish();
    check_cancel();
    sink->commit();
  }

  void write_safetensors() {
    const format::Metadata& md = reader_->metadata();
    if (options_.layout != ConsolidateLayout::kDcp) {
      // Only to report Lightning's errors on the layout (meta.pt, "model") the same way.
      open_meta();
    }
    std::vector<std::pair<format::SafetensorsEntry, std::size_t>> tensors;
    bool has_model = false;
    for (const std::string& fqn : fqns_) {
      const auto* t = std::get_if<format::TensorStorageMetadata>(&md.state_dict_metadata.at(fqn));
      format::ObjectPath path = path_of(md, fqn);
      if (options_.layout != ConsolidateLayout::kDcp) {
        const auto* first = std::get_if<std::string>(&path.front());
        if (first == nullptr || *first != "model") continue;
        has_model = true;
        if (t == nullptr) continue;
        path.erase(path.begin());
      }
      if (t == nullptr) continue;
      format::SafetensorsEntry e;
      e.name = options_.layout == ConsolidateLayout::kDcp ? fqn : path_to_fqn(path);
      e.dtype = t->properties.dtype;
      e.shape = t->size;
      TensorSource src;
      src.fqn = fqn;
      src.dtype = e.dtype;
      src.shape = e.shape;
      tensors.emplace_back(std::move(e), sources_.size());
      sources_.push_back(std::move(src));
    }
    if (options_.layout != ConsolidateLayout::kDcp && !has_model) {
      throw PlanError("the checkpoint has no \"model\" key, so there are no model weights to write as safetensors");
    }
    for (const auto& [e, _] : tensors) total_ += e.nbytes();
    if (progress_) progress_(ConsolidateProgress{0, total_});

    // Group into files.
    std::vector<std::vector<std::size_t>> files(1);
    std::uint64_t in_file = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::uint64_t n = tensors[i].first.nbytes();
      if (options_.max_shard_bytes > 0 && in_file > 0 && in_file + n > options_.max_shard_bytes) {
        files.emplace_back();
        in_file = 0;
      }
      files.back().push_back(i);
      in_file += n;
    }

    auto write_file = [&](storage::Storage& out, const std::string& key, const std::vector<std::size_t>& members) {
      storage::WriteOptions wo;
      wo.durable = options_.durable;
      auto sink = out.open_writer(key, wo);
      std::vector<format::SafetensorsEntry> entries;
      for (std::size_t i : members) entries.push_back(tensors[i].first);
      format::SafetensorsWriter writer(*sink, std::move(entries));
      std::vector<std::size_t> seq;
      for (std::size_t i : members) seq.push_back(tensors[i].second);
      stream_sources(
          seq, [](std::size_t) {}, [&](std::span<const std::byte> data) { writer.write(data); },
          [&](std::size_t k) {
            ++report_.tensors;
            report_.tensor_bytes += sources_[seq[k]].nbytes();
          });
      writer.finish();
      check_cancel();
      sink->commit();
    };

    if (options_.max_shard_bytes == 0) {
      auto [root, key] = output_root_and_key();
      auto out = open_output_storage(root);
      write_file(*out, key, files.front());
      return;
    }
    // A folder of shards + index. Local: built in a temporary folder renamed at the end.
    // Object store: shard objects first, the index last (a reader that finds the index
    // finds every shard); on failure the shards already committed are removed.
    std::optional<TempFolder> tmp;
    if (!remote_out_) tmp.emplace(output_);
    auto out = open_output_storage(remote_out_ ? output_ : tmp->path());
    std::vector<std::string> written;
    try {
      nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
      char name[64];
      std::map<std::string, std::string> sorted_map;
      for (std::size_t f = 0; f < files.size(); ++f) {
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
        write_file(*out, name, files[f]);
        written.push_back(name);
        for (std::size_t i : files[f]) sorted_map[tensors[i].first.name] = name;
      }
      for (const auto& [k, v] : sorted_map) weight_map[k] = v;
      nlohmann::ordered_json index;
      index["metadata"] = {{"total_size", total_}};
      index["weight_map"] = weight_map;
      std::string text = index.dump(2) + "\n";
      storage::WriteOptions wo;
      wo.durable = options_.durable;
      check_cancel();
      out->write_atomic(kSafetensorsIndex, as_bytes(text), wo);
    } catch (...) {
      if (remote_out_) remove_quietly(*out, written);
      throw;
    }
    if (tmp) tmp->publish(options_.durable);
  }

  // Best effort: the original error is what the caller needs to see.
  static void remove_quietly(storage::Storage& st, const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      try {
        st.remove(key);
      } catch (const std::exception&) {
      }
    }
  }

  // Where the single output object goes: (parent folder or URL prefix, name in it).
  std::pair<std::string, std::string> output_root_and_key() const {
    if (remote_out_) return split_parent_url(output_, "output");
    return {parent_of(output_), base_of(output_)};
  }

  const ConsolidateOptions& options_;
  const std::function<void(const ConsolidateProgress&)>& progress_;
  std::string folder_;
  std::string output_;
  std::shared_ptr<storage::Storage> input_;
  std::unique_ptr<CheckpointReader> reader_;
  std::unique_ptr<torchfile::TorchFile> meta_;
  std::vector<std::string> fqns_;  // every key of state_dict_metadata, in the pickled order
  bool remote_in_ = false;   // the checkpoint is an object-store URL
  bool remote_out_ = false;  // the output is an object-store URL
  std::mutex advise_mu_;
  std::map<std::string, UniqueFd> advise_fds_;  // advise(): one descriptor per shard file
  std::mutex meta_mu_;
  std::vector<TensorSource> sources_;
  std::unordered_map<const Value*, std::size_t> placeholders_;
  std::unordered_map<const Value*, ValuePtr> made_;
  std::unordered_set<const Value*> visited_;
  std::vector<ValuePtr> keep_;
  std::vector<std::size_t> order_;  // storage key k -> source index
  std::size_t slab_bytes_ = 0;
  std::size_t pool_bytes_ = 0;    // the output writer's staging pool
  std::size_t part_bytes_ = 0;    // one buffer of that pool (an upload part)
  std::size_t buffer_bytes_ = 0;  // each of the kSlabBuffers slab buffers
  std::size_t readers_ = 1;       // reader threads
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, FreeDeleter> slab_;  // kSlabBuffers page-aligned buffers
  std::uint64_t done_ = 0;
  std::uint64_t total_ = 0;
  ConsolidateReport report_;
};

}  // namespace

std::string normalize_path(const std::string& path) {
  if (path.empty()) return ".";
  bool absolute = path.front() == '/';
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i <= path.size()) {
    std::size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (!part.empty() && part != ".") parts.push_back(part);
    i = j + 1;
  }
  std::string out = absolute ? "/" : "";
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (k) out += '/';
    out += parts[k];
  }
  if (out.empty()) return ".";
  return out;
}

BoxCursor::BoxCursor(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes) : shape_(shape) {
  if (shape.empty()) {
    scalar_bytes_ = itemsize;
    return;
  }
  for (auto d : shape) {
    if (d == 0) done_ = true;  // no elements: no boxes
  }
  if (done_) return;
  const std::size_t rank = shape.size();
  std::vector<std::uint64_t> tail(rank + 1);  // bytes of one index of dims [0, k)
  tail[rank] = itemsize;
  for (std::size_t k = rank; k-- > 0;) tail[k] = tail[k + 1] * static_cast<std::uint64_t>(shape[k]);
  while (d_ + 1 < rank && tail[d_ + 1] > max_bytes) ++d_;
  row_ = tail[d_ + 1];
  block_ = static_cast<std::int64_t>(std::max<std::uint64_t>(1, max_bytes / row_));
  offsets_.assign(rank, 0);
  sizes_ = shape;
  for (std::size_t k = 0; k < d_; ++k) sizes_[k] = 1;
}

bool BoxCursor::next(Shape& offsets, Shape& sizes, std::uint64_t& n) {
  if (done_) return false;
  if (shape_.empty()) {
    offsets.clear();
    sizes.clear();
    n = scalar_bytes_;
    done_ = true;
    return true;
  }
  offsets_[d_] = start_;
  sizes_[d_] = std::min(block_, shape_[d_] - start_);
  offsets = offsets_;
  sizes = sizes_;
  n = row_ * static_cast<std::uint64_t>(sizes_[d_]);
  start_ += block_;
  if (start_ >= shape_[d_]) {
    start_ = 0;
    offsets_[d_] = 0;
    done_ = true;  // unless the odometer over dims [0, d_) moves on
    for (std::size_t k = d_; k > 0;) {
      --k;
      if (++offsets_[k] < shape_[k]) {
        done_ = false;
        break;
      }
      offsets_[k] = 0;
    }
  }
  return true;
}

void for_each_box(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes,
                  const std::function<void(const Shape&, const Shape&, std::uint64_t)>& fn) {
  BoxCursor cursor(shape, itemsize, max_bytes);
  Shape offsets, sizes;
  std::uint64_t n = 0;
  while (cursor.next(offsets, sizes, n)) fn(offsets, sizes, n);
}

namespace {

void validate_local_folder(const ConsolidateOptions& options, const std::string& folder) {
  struct stat st {};
  if (!path_exists(folder, &st)) throw PlanError("The provided checkpoint folder does not exist: " + folder);
  if (!S_ISDIR(st.st_mode)) {
    throw PlanError("The provided checkpoint path must be a folder, containing the checkpoint shards: " + folder);
  }
  if (options.layout != ConsolidateLayout::kDcp) {
    struct stat meta {};
    std::string meta_path = folder == "/" ? "/meta.pt" : folder + "/" + kMetaPt;
    if (!path_exists(meta_path, &meta) || !S_ISREG(meta.st_mode)) {
      throw PlanError(
          "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
          "is not in that format: " +
          folder);
    }
  }
}

}  // namespace

namespace {

// The output checks for an object-store URL: no object under the key, none under it as a
// prefix (a folder of safetensors shards).
void validate_remote_output(const std::string& output) {
  auto [parent, key] = split_parent_url(output, "output");
  bool exists = storage::open_storage(parent)->try_stat(key).has_value();
  if (!exists) exists = !storage::open_storage(output)->list("").empty();
  if (exists) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the object first: " +
        output);
  }
}

// Lightning's checks worded for a URL prefix: objects under it, meta.pt among them.
void validate_remote_folder(const ConsolidateOptions& options, const std::string& folder) {
  auto input = storage::open_storage(folder);
  bool has_objects = input->try_stat(".metadata").has_value() || !input->list("").empty();
  if (!has_objects) {
    if (std::optional<ObjectUrl> object = split_object_url(folder)) {
      if (storage::open_storage(object->parent)->try_stat(object->key)) {
        throw PlanError(
            "The provided checkpoint path must be a folder, containing the checkpoint shards: " + folder +
            " is an object, not a prefix with objects under it");
      }
    }
    throw PlanError("The provided checkpoint folder does not exist: there are no objects under " + folder);
  }
  if (options.layout != ConsolidateLayout::kDcp && !input->try_stat(kMetaPt)) {
    throw PlanError(
        "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
        "is not in that format (no meta.pt under it): " +
        folder);
  }
}

}  // namespace

std::string validate_consolidate(const ConsolidateOptions& options) {
  const std::string folder = normalize_location(options.checkpoint_folder);
  if (is_storage_url(folder)) {
    validate_remote_folder(options, folder);
  } else {
    validate_local_folder(options, folder);
  }
  std::string output = options.output_file.empty() ? default_output_for(folder) : normalize_location(options.output_file);
  if (is_storage_url(output)) {
    validate_remote_output(output);
    return output;
  }
  struct stat out {};
  if (path_exists(output, &out)) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the file first: " +
        output);
  }
  return output;
}

ConsolidateReport consolidate(const ConsolidateOptions& options,
                              const std::function<void(const ConsolidateProgress&)>& progress) {
  if (options.memory_budget == 0) throw UsageError("consolidate: memory budget must be > 0");
  Consolidator c(options, progress);
  return c.run();
}

}  // namespace shardpoint::engine
