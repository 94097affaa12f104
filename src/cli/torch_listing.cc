// CheckpointListing of a torch.save file. With the zip CRC-32 checks on, the small records
// are checked at open and each tensor's storage record as its bytes are streamed
// (engine/torch_file_crc.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cli/checkpoint_listing.h"
#include "engine/torch_file_crc.h"
#include "pickle/repr.h"
#include "shardpoint/error.h"
#include "torchfile/torch_file.h"

namespace shardpoint::cli {
namespace {

using pickle::Kind;
using pickle::Value;

// A dict, or an object that carries dict entries (OrderedDict and friends).
bool is_mapping(const Value& v) {
  if (v.is(Kind::kDict)) return true;
  return v.is(Kind::kObject) && !v.entries().empty() && v.items().empty();
}

std::string key_text(const Value& key) {
  if (key.is(Kind::kStr)) return key.as_string();
  if (key.is(Kind::kInt)) return pickle::repr(key);
  return pickle::repr(key);
}

class TorchListing final : public CheckpointListing {
 public:
  TorchListing(const std::string& name, std::unique_ptr<torchfile::TorchFile> file, bool check_zip_crc)
      : path_(name), file_(std::move(file)) {
    if (check_zip_crc) {
      crc_ = std::make_unique<engine::TorchFileCrc>(*file_, path_);
      crc_->check_small_records();
    }
    walk(*file_->root(), "", 0);
  }

  std::string format() const override { return "torch"; }
  std::string description() const override {
    return fmt::format("{}: torch.save archive '{}' (format version {}, {})", path_, file_->archive_name(),
                       file_->version(), file_->big_endian() ? "big-endian" : "little-endian");
  }
  const std::vector<ListingEntry>& entries() const override { return entries_; }
  engine::ZipCrcCounts zip_crc_counts() const override { return crc_ ? crc_->counts() : engine::ZipCrcCounts{}; }

  void stream_tensor(std::size_t i, const std::function<void(ByteSpan)>& fn) const override {
    const torchfile::TensorInfo& info = *tensor_for_entry_.at(i);
    std::size_t itemsize = dtype_itemsize(info.dtype);
    bool complex =
        info.dtype == DType::kComplex32 || info.dtype == DType::kComplex64 || info.dtype == DType::kComplex128;
    std::size_t swap_unit = complex ? itemsize / 2 : itemsize;
    // A contiguous tensor's pieces are pieces of its storage record's CRC-32; a strided
    // one's element runs are too small to check one by one: its record is checked whole.
    engine::TorchFileCrc* const crc = crc_ && info.is_contiguous() ? crc_.get() : nullptr;
    if (crc_ && crc == nullptr) crc_->check_storage(info, entries_.at(i).key);
    std::vector<std::byte> buffer;
    torchfile::for_each_run(info, [&](std::uint64_t offset, std::uint64_t nbytes) {
      while (nbytes > 0) {
        std::uint64_t piece = std::min<std::uint64_t>(nbytes, kPieceBytes - kPieceBytes % itemsize);
        auto view = file_->source().view(offset, piece, "tensor data");
        if (view && !info.big_endian) {
          if (crc != nullptr) {
            crc->add_view(info, entries_.at(i).key, offset, *view, fn);
          } else {
            fn(*view);
          }
        } else {
          buffer.resize(piece);
          if (crc != nullptr) {
            crc->read(info, entries_.at(i).key, offset, buffer, "tensor data");
          } else {
            file_->source().read(offset, buffer, "tensor data");
          }
          if (info.big_endian && swap_unit > 1) {
            for (std::size_t e = 0; e + swap_unit <= buffer.size(); e += swap_unit) {
              std::reverse(buffer.data() + e, buffer.data() + e + swap_unit);
            }
          }
          fn(buffer);
        }
        offset += piece;
        nbytes -= piece;
      }
    });
  }

 private:
  static constexpr std::uint64_t kPieceBytes = 8 << 20;
  static constexpr int kMaxDepth = 1000;

  // True when the subtree holds a tensor or a mapping (DCP descends such lists).
  bool holds_tensor_or_mapping(const Value& v, int depth) const {
    if (depth > kMaxDepth) return false;
    if (file_->tensor_of(v) != nullptr || is_mapping(v)) return true;
    if (v.is(Kind::kList) || v.is(Kind::kTuple)) {
      for (const auto& item : v.items()) {
        if (item && holds_tensor_or_mapping(*item, depth + 1)) return true;
      }
    }
    return false;
  }

  void walk(const Value& v, const std::string& key, int depth) {
    if (depth > kMaxDepth) throw FormatError(path_ + ": nesting deeper than " + std::to_string(kMaxDepth));
    auto join = [&](const std::string& part) { return key.empty() ? part : key + "." + part; };
    if (const torchfile::TensorInfo* t = file_->tensor_of(v)) {
      ListingEntry e;
      e.key = key;
      e.is_tensor = true;
      e.dtype = t->dtype;
      e.shape = t->shape;
      e.nbytes = t->nbytes();
      if (t->is_parameter) e.detail = "parameter";
      if (t->location != "cpu") e.detail += (e.detail.empty() ? "" : ", ") + t->location;
      tensor_for_entry_[entries_.size()] = t;
      entries_.push_back(std::move(e));
      return;
    }
    if (is_mapping(v)) {
      for (const auto& [k, child] : v.entries()) walk(*child, join(key_text(*k)), depth + 1);
      return;
    }
    if ((v.is(Kind::kList) || v.is(Kind::kTuple)) && holds_tensor_or_mapping(v, depth)) {
      for (std::size_t i = 0; i < v.items().size(); ++i) walk(*v.items()[i], join(std::to_string(i)), depth + 1);
      return;
    }
    ListingEntry e;
    e.key = key;
    e.repr = object_repr(v, *file_);
    entries_.push_back(std::move(e));
  }

  std::string path_;
  std::unique_ptr<torchfile::TorchFile> file_;
  std::unique_ptr<engine::TorchFileCrc> crc_;  // null without check_zip_crc
  std::vector<ListingEntry> entries_;
  std::unordered_map<std::size_t, const torchfile::TensorInfo*> tensor_for_entry_;
};

}  // namespace

std::unique_ptr<CheckpointListing> open_torch_listing(const std::string& name,
                                                      const std::function<std::unique_ptr<ByteSource>()>& open_source,
                                                      bool check_zip_crc) {
  return std::make_unique<TorchListing>(name, engine::open_torch_file_naming_crc(open_source, name, check_zip_crc),
                                        check_zip_crc);
}

std::unique_ptr<CheckpointListing> open_torch_listing(const std::string& path, bool check_zip_crc) {
  try {
    return open_torch_listing(
        path, [&]() -> std::unique_ptr<ByteSource> { return MappedSource::open(path); }, check_zip_crc);
  } catch (const FormatError& e) {
    // Name the file once: messages from the reader may already start with it.
    std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw FormatError(path + ": " + what);
  }
}

}  // namespace shardpoint::cli
