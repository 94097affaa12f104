// `shardpoint verify PATH`: checks a checkpoint end to end, reading every byte once with
// bounded memory. PATH is a local path or a storage URL (engine::locate_checkpoint).
//   DCP folder: .metadata decodes; its consistency (check_metadata: chunks tile each tensor
//   exactly, every item has a storage entry, safe relative paths, no overlapping byte
//   ranges); every referenced file present and long enough; every tensor chunk and object
//   item parses and reads (checksums verified where the sidecar exists); the load index,
//   when present, matches .metadata and agrees with it, the sidecar and the blobs; meta.pt,
//   when present, parses and its tensors read.
//   torch.save file: the zip and data.pkl parse, every storage record is present and long
//   enough, and every record's CRC-32 matches.
// Exit 0 when clean (a one-line summary on stdout); otherwise one line per problem on
// stdout, a count on stderr, and exit 1.
#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/checkpoint_listing.h"
#include "cli/commands.h"
#include "core/checksum.h"
#include "core/error.h"
#include "engine/checkpoint_index.h"
#include "engine/checkpoint_reader.h"
#include "engine/item_reader.h"
#include "engine/chunking.h"
#include "engine/reshard.h"
#include "format/checkpoint_path.h"
#include "format/metadata_codec.h"
#include "storage/local_storage.h"
#include "storage/location.h"
#include "storage/storage_registry.h"
#include "torchfile/torch_file.h"

namespace shardpoint::cli {
namespace {

constexpr std::size_t kSlabBytes = std::size_t{32} << 20;

struct Verification {
  std::vector<std::string> problems;
  std::uint64_t tensors = 0;
  std::uint64_t objects = 0;
  std::uint64_t bytes = 0;
};

void verify_torch_file(const engine::CheckpointLocation& location, const std::string& label, Verification& v) {
  std::unique_ptr<torchfile::TorchFile> file;
  try {
    file = engine::open_torch_file(location);
  } catch (const std::exception& e) {
    v.problems.push_back(label + ": " + e.what());
    return;
  }
  std::vector<std::byte> buf;
  for (const auto& entry : file->archive().entries()) {
    if (entry.method != 0) continue;  // compressed records: torch.save never writes them
    std::uint32_t crc = 0;
    try {
      std::uint64_t done = 0;
      while (done < entry.uncompressed_size) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kSlabBytes, entry.uncompressed_size - done));
        buf.resize(n);
        file->source().read(entry.data_offset + done, buf, entry.name);
        crc = crc32(crc, buf);
        done += n;
      }
      v.bytes += entry.uncompressed_size;
    } catch (const std::exception& e) {
      v.problems.push_back(label + ": record \"" + entry.name + "\": " + e.what());
      continue;
    }
    if (crc != entry.crc32) {
      char msg[64];
      std::snprintf(msg, sizeof msg, "expected CRC-32 %08x, found %08x", entry.crc32, crc);
      v.problems.push_back(label + ": record \"" + entry.name + "\": " + msg);
    }
  }
  v.tensors += file->tensors().size();
}

// `local_folder`: the folder's path when it is on the local filesystem (symlinks are then
// checked not to leave it).
// The load index, when there is one: it must describe this `.metadata` (loads ignore one
// that does not, so it is only dead weight, but a folder should not carry it) and say what
// `.metadata`, the sidecar and the blobs say.
void verify_load_index(storage::Storage& st, const engine::CheckpointReader& reader, Verification& v) {
  const std::string name = st.describe_key(engine::kIndexKey);
  engine::CheckpointIndex index;
  try {
    const std::optional<std::string> bytes = st.try_read_all(engine::kIndexKey);
    if (!bytes) return;
    if (!engine::index_matches(*bytes, as_bytes(st.try_read_all(engine::kMetadataKey).value_or(std::string())))) {
      v.problems.push_back(name + ": does not match .metadata (damaged, or left by another save); loads ignore it, "
                                  "remove it");
      return;
    }
    index = engine::decode_checkpoint_index(*bytes, name);
  } catch (const std::exception& e) {
    v.problems.push_back(e.what());
    return;
  }
  const format::Metadata& md = reader.metadata();
  if (index.metadata.state_dict_metadata != md.state_dict_metadata || index.metadata.storage_data != md.storage_data ||
      index.metadata.planner_data != md.planner_data) {
    v.problems.push_back(name + ": its tensors, objects or storage entries differ from .metadata's");
  }
  if (reader.sidecar().has_value() != index.checksums.has_value() ||
      (index.checksums && index.checksums->items() != reader.sidecar()->items())) {
    v.problems.push_back(name + ": its checksums differ from the sidecar's");
  }
  engine::SourceCache sources(st);
  for (const auto& [key, start] : index.data_offsets) {
    try {
      const auto& info = md.storage_data.at(key);
      const auto& tensor = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(key.fqn));
      const auto chunk = std::find_if(tensor.chunks.begin(), tensor.chunks.end(),
                                      [&](const auto& c) { return key.offset && c.offsets == *key.offset; });
      if (chunk == tensor.chunks.end()) throw FormatError("no such chunk in .metadata");
      engine::SavedTensorBlob blob(sources.get(info.relative_path), info, key.fqn, *chunk, tensor.properties.dtype);
      if (blob.data_start() != start) {
        v.problems.push_back(name + ": item \"" + key.fqn + "\": data starts at " + std::to_string(blob.data_start()) +
                             " of its blob, the index says " + std::to_string(start));
      }
    } catch (const std::exception& e) {
      v.problems.push_back(name + ": item \"" + key.fqn + "\": " + e.what());
    }
  }
}

void verify_dcp(const std::shared_ptr<storage::Storage>& st, const std::optional<std::string>& local_folder,
                Verification& v) {
  std::unique_ptr<engine::CheckpointReader> reader;
  try {
    reader = std::make_unique<engine::CheckpointReader>(*st);
  } catch (const std::exception& e) {
    v.problems.push_back(e.what());
    return;
  }
  const format::Metadata& md = reader->metadata();
  for (const std::string& p : format::check_metadata(md)) v.problems.push_back(st->describe_key(".metadata") + ": " + p);
  verify_load_index(*st, *reader, v);

  // Files: present, long enough for every item; items with a bad file are not read.
  std::map<std::string, std::optional<std::uint64_t>> sizes;
  std::set<std::string> bad_items;  // fqn
  for (const auto& [index, info] : md.storage_data) {
    if (!format::is_safe_relative_path(info.relative_path)) {
      bad_items.insert(index.fqn);
      continue;  // check_metadata reported it
    }
    try {
      if (local_folder) format::resolve_item_path(*local_folder, info.relative_path);
    } catch (const std::exception& e) {
      v.problems.push_back(e.what());
      bad_items.insert(index.fqn);
      continue;
    }
    auto it = sizes.find(info.relative_path);
    if (it == sizes.end()) {
      it = sizes.emplace(info.relative_path, st->try_stat(info.relative_path)).first;
      if (!it->second) v.problems.push_back(st->describe_key(info.relative_path) + ": missing (referenced by .metadata)");
    }
    if (!it->second) {
      bad_items.insert(index.fqn);
    } else if (info.offset + info.length > *it->second) {
      v.problems.push_back(st->describe_key(info.relative_path) + ": item \"" + index.fqn + "\" needs " +
                           std::to_string(info.offset + info.length) + " bytes, file has " +
                           std::to_string(*it->second) + " (truncated)");
      bad_items.insert(index.fqn);
    }
  }

  std::vector<std::byte> slab;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (bad_items.count(fqn)) continue;
    try {
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
        if (!format::check_chunk_tiling(*t).empty()) continue;  // reported above
        const std::size_t itemsize = dtype_itemsize(t->properties.dtype);
        for (const auto& chunk : t->chunks) {
          engine::for_each_box(chunk.sizes, itemsize, kSlabBytes,
                               [&](const format::Shape& off, const format::Shape& sizes, std::uint64_t n) {
                                 format::Shape global(off);
                                 for (std::size_t d = 0; d < global.size(); ++d) global[d] += chunk.offsets[d];
                                 slab.resize(static_cast<std::size_t>(n));
                                 reader->read_box(fqn, global, sizes, slab);
                                 v.bytes += n;
                               });
        }
        ++v.tensors;
      } else {
        reader->read_object(fqn);
        ++v.objects;
      }
    } catch (const std::exception& e) {
      std::string what = e.what();
      v.problems.push_back(what.find(fqn) == std::string::npos ? "item \"" + fqn + "\": " + what : what);
    }
  }

  if (st->try_stat("meta.pt")) {
    engine::CheckpointLocation meta;
    meta.name = st->describe_key("meta.pt");
    if (local_folder) {
      meta.local_file = *local_folder + "/meta.pt";
    } else {
      meta.storage = st;
      meta.key = "meta.pt";
    }
    Verification mv;
    verify_torch_file(meta, local_folder ? meta.local_file : meta.name, mv);
    v.problems.insert(v.problems.end(), mv.problems.begin(), mv.problems.end());
    v.objects += 1;
    v.bytes += mv.bytes;
  }
}

class VerifyCommand : public Command {
 public:
  void add_to(CLI::App& app) override {
    sub_ = app.add_subcommand("verify", "Check that a checkpoint is complete and intact (reads all data)");
    sub_->footer(
        "PATH is a DCP checkpoint folder or a torch.save file, or a storage URL of either: a\n"
        "URL is a DCP checkpoint when <PATH>/.metadata exists, else a torch.save file when its\n"
        "last segment is an object; a prefix with neither is refused (\"not a committed\n"
        "checkpoint\", exit 1). Every byte is read once (ranged reads on object stores) and\n"
        "checked against the checksum sidecar where there is one; a load index\n"
        "(.shardpoint-index) must match .metadata and agree with it, the sidecar and the blobs.\n\n" +
        std::string(storage_url_help()) +
        "\n"
        "Exit 0 when clean; otherwise one line per problem and exit 1 (also when PATH cannot\n"
        "be read, e.g. an authentication error).");
    sub_->add_option("PATH", path_, "checkpoint folder or file (path or URL)")->required();
  }
  bool parsed() const override { return sub_->parsed(); }

  int run() override {
    const storage::Location where = storage::Location::parse(path_);
    const bool remote = where.is_remote();
    std::optional<std::string> local;  // the path on the local filesystem, file:// stripped
    if (!remote) {
      local = where.path();
      struct stat st {};
      if (::stat(local->c_str(), &st) != 0) {
        throw StorageError(StorageError::Kind::kNotFound, "\"" + path_ + "\": no such file or folder");
      }
    }
    engine::CheckpointLocation location = engine::locate_checkpoint(path_);
    Verification v;
    if (location.is_dcp) {
      verify_dcp(location.storage, local, v);
    } else {
      verify_torch_file(location, path_, v);
    }
    if (!v.problems.empty()) {
      std::string out;
      // Problems inside a remote checkpoint name its URL ("s3://b/ckpt: __1_0.distcp: ...").
      for (const auto& p : v.problems) out += (remote && p.find(path_) == std::string::npos ? path_ + ": " : "") + p + "\n";
      print_out(out);
      std::cerr << "shardpoint: " << path_ << ": " << v.problems.size() << " problem"
                << (v.problems.size() == 1 ? "" : "s") << " found\n";
      return 1;
    }
    print_out("ok: " + std::to_string(v.tensors) + " tensors, " + std::to_string(v.objects) + " objects, " +
              std::to_string(v.bytes) + " bytes verified\n");
    return 0;
  }

 private:
  CLI::App* sub_ = nullptr;
  std::string path_;
};

}  // namespace

std::unique_ptr<Command> make_verify_command() { return std::make_unique<VerifyCommand>(); }

}  // namespace shardpoint::cli
