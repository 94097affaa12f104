// CheckpointListing of a checkpoint folder (DCP, or Hugging Face safetensors): keys from
// `.metadata` (or the safetensors headers), objects read from
// their bytes items, tensors reassembled from their chunks slab by slab (bounded memory),
// plus the chunk layout per file for the human listing.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "cli/checkpoint_listing.h"
#include "engine/checkpoint_location.h"
#include "pickle/repr.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::cli {
namespace {

std::uint64_t volume(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

std::string box_text(const format::Shape& offsets, const format::Shape& sizes) {
  std::vector<std::string> dims;
  for (std::size_t d = 0; d < offsets.size(); ++d) {
    dims.push_back(fmt::format("{}:{}", offsets[d], offsets[d] + sizes[d]));
  }
  return "[" + fmt::format("{}", fmt::join(dims, ", ")) + "]";
}

class DcpListing final : public CheckpointListing {
 public:
  DcpListing(const engine::CheckpointLocation& location, bool check_zip_crc)
      : path_(location.name),
        storage_(location.storage),
        reader_(*storage_, engine::CheckpointReaderOptions{.check_zip_crc = check_zip_crc}),
        kind_(location.kind) {
    for (const auto& [fqn, entry] : reader_.metadata().state_dict_metadata) {
      ListingEntry e;
      e.key = fqn;
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
        e.is_tensor = true;
        e.dtype = t->properties.dtype;
        e.shape = t->size;
        e.nbytes = volume(t->size) * dtype_itemsize(t->properties.dtype);
        e.detail = t->chunks.size() == 1 ? "1 chunk" : fmt::format("{} chunks", t->chunks.size());
      } else {
        std::shared_ptr<const torchfile::TorchFile> item = reader_.read_object_file(fqn);
        e.repr = object_repr(*item->root(), *item);
      }
      entries_.push_back(std::move(e));
    }
  }

  std::string format() const override { return std::string(engine::checkpoint_kind_name(kind_)); }
  std::string description() const override {
    std::set<std::string> files;
    for (const auto& [index, info] : reader_.metadata().storage_data) files.insert(info.relative_path);
    return fmt::format("{}: {} checkpoint, {} files{}{}", path_,
                       kind_ == engine::CheckpointKind::kDcp ? "DCP" : "Hugging Face safetensors", files.size(),
                       reader_.sidecar() ? ", shardpoint checksums" : "",
                       reader_.metadata().version ? ", DCP version " + *reader_.metadata().version : "");
  }
  const std::vector<ListingEntry>& entries() const override { return entries_; }
  engine::ZipCrcCounts zip_crc_counts() const override { return reader_.zip_crc_counts(); }

  // Reassembles the tensor in row-major order in slabs along dim 0 of at most kSlabBytes
  // (one row at least), so hashing a tensor of any size needs bounded memory.
  void stream_tensor(std::size_t i, const std::function<void(ByteSpan)>& fn) const override {
    const ListingEntry& e = entries_.at(i);
    std::size_t itemsize = dtype_itemsize(e.dtype);
    if (e.shape.empty()) {
      std::vector<std::byte> one(itemsize);
      reader_.read_box(e.key, {}, {}, one);
      fn(one);
      return;
    }
    std::uint64_t row_bytes = volume({e.shape.begin() + 1, e.shape.end()}) * itemsize;
    if (row_bytes == 0 || e.shape[0] == 0) return;
    std::int64_t rows_per_slab = static_cast<std::int64_t>(std::max<std::uint64_t>(1, kSlabBytes / row_bytes));
    std::vector<std::byte> slab;
    for (std::int64_t row = 0; row < e.shape[0]; row += rows_per_slab) {
      std::int64_t rows = std::min(rows_per_slab, e.shape[0] - row);
      format::Shape offsets(e.shape.size(), 0), sizes = e.shape;
      offsets[0] = row;
      sizes[0] = rows;
      slab.resize(static_cast<std::size_t>(rows) * row_bytes);
      reader_.read_box(e.key, offsets, sizes, slab);
      fn(slab);
    }
  }

  std::string layout_text() const override {
    // file -> items in offset order
    std::map<std::string, std::vector<std::pair<std::uint64_t, std::string>>> files;
    for (const auto& [index, info] : reader_.metadata().storage_data) {
      std::string what = "\"" + index.fqn + "\"";
      if (index.offset) {
        const auto& t = std::get<format::TensorStorageMetadata>(reader_.metadata().state_dict_metadata.at(index.fqn));
        for (const auto& c : t.chunks) {
          if (c.offsets == *index.offset) what += " " + box_text(c.offsets, c.sizes);
        }
      } else {
        what += " (object)";
      }
      // Stream transforms: the size shown is the stored (compressed) one.
      for (const std::string& d : info.transform_descriptors) what += " " + d;
      files[info.relative_path].push_back(
          {info.offset, fmt::format("    @{:<10} {:>10}  {}", info.offset, human_bytes_short(info.length), what)});
    }
    std::string out = "chunk layout by file:\n";
    for (auto& [file, items] : files) {
      std::sort(items.begin(), items.end());
      out += "  " + file + fmt::format(" ({} items)\n", items.size());
      for (const auto& [offset, line] : items) out += line + "\n";
    }
    return out;
  }

 private:
  static constexpr std::uint64_t kSlabBytes = 16 << 20;

  static std::string human_bytes_short(std::uint64_t n) { return fmt::format("{} B", n); }

  std::string path_;
  std::shared_ptr<storage::Storage> storage_;
  mutable engine::CheckpointReader reader_;
  engine::CheckpointKind kind_;
  std::vector<ListingEntry> entries_;
};

}  // namespace

std::unique_ptr<CheckpointListing> open_dcp_listing(const engine::CheckpointLocation& location, bool check_zip_crc) {
  return std::make_unique<DcpListing>(location, check_zip_crc);
}

}  // namespace shardpoint::cli
