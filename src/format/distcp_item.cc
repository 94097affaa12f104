#include "format/distcp_item.h"

#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "shardpoint/error.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::format {
namespace {

constexpr std::string_view kZstd = "stream.zstd/1";

// A window [base, base+length) of a source that has no window of its own.
class WindowSource final : public ByteSource {
 public:
  WindowSource(std::shared_ptr<const ByteSource> parent, std::uint64_t base, std::uint64_t length, std::string name)
      : parent_(std::move(parent)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    parent_->read(base_ + offset, out, what);
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    return parent_->view(base_ + offset, length, what);
  }

 private:
  std::shared_ptr<const ByteSource> parent_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
};

// Bytes owned by the source (a decompressed item).
class OwnedMemorySource final : public ByteSource {
 public:
  OwnedMemorySource(std::string data, std::string name) : data_(std::move(data)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return data_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (!out.empty()) std::copy_n(reinterpret_cast<const std::byte*>(data_.data()) + offset, out.size(), out.data());
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    return as_bytes(data_).subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
  }

 private:
  std::string data_;
  std::string name_;
};

std::string item_label(const ByteSource& distcp, const StorageInfo& info, std::string_view fqn) {
  return distcp.name() + ": item '" + std::string(fqn) + "' [" + std::to_string(info.offset) + "+" +
         std::to_string(info.length) + "]";
}

void check_item_range(const ByteSource& distcp, const StorageInfo& info, std::string_view fqn) {
  if (info.offset > distcp.size() || info.length > distcp.size() - info.offset) {
    throw FormatError(item_label(distcp, info, fqn) + ": expected the item inside the file of " +
                      std::to_string(distcp.size()) + " bytes, found it reaching past the end");
  }
}

void check_transforms(const StorageInfo& info, std::string_view fqn) {
  for (const std::string& d : info.transform_descriptors) {
    if (!is_known_transform(d)) {
      throw FormatError("unknown transform '" + d + "' on item '" + std::string(fqn) + "'");
    }
  }
}

std::string hex_prefix(std::string_view data) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < std::min<std::size_t>(data.size(), 4); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(data[i]));
    if (i) out += ' ';
    out += buf;
  }
  return out.empty() ? "no bytes" : out;
}

struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// Decompresses one or more zstd frames, never producing more than `cap` bytes.
std::string zstd_decompress(std::string_view in, std::uint64_t cap, const std::string& label) {
  if (in.empty()) throw FormatError(label + ": expected a zstd stream, found no bytes");
  unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) {
    throw FormatError(label + ": expected a zstd frame (magic 28 b5 2f fd), found " + hex_prefix(in));
  }
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > cap) {
    throw FormatError(label + ": zstd frame declares " + std::to_string(declared) + " bytes, more than the limit of " +
                      std::to_string(cap) + " (ItemOptions::max_decompressed_bytes)");
  }
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  if (!ctx) throw std::bad_alloc();
  std::string out;
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN) out.reserve(static_cast<std::size_t>(declared));
  const std::size_t step = ZSTD_DStreamOutSize();
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  std::size_t pending = 1;  // nonzero: a frame is not complete yet
  while (true) {
    const std::size_t old = out.size();
    // Room for one more step, never past cap; at cap, room for one byte detects excess.
    const std::uint64_t room = old >= cap ? 1 : std::min<std::uint64_t>(step, cap - old);
    out.resize(old + static_cast<std::size_t>(room));
    ZSTD_outBuffer output{out.data() + old, static_cast<std::size_t>(room), 0};
    pending = ZSTD_decompressStream(ctx.get(), &output, &input);
    out.resize(old + output.pos);
    if (ZSTD_isError(pending)) {
      throw FormatError(label + ": corrupt zstd data: " + ZSTD_getErrorName(pending));
    }
    if (out.size() > cap) {
      throw FormatError(label + ": zstd data decompresses to more than the limit of " + std::to_string(cap) +
                        " bytes (ItemOptions::max_decompressed_bytes)");
    }
    const bool input_done = input.pos == input.size;
    const bool output_full = output.pos == output.size;
    if (pending == 0 && input_done) break;
    if (input_done && !output_full) {
      throw FormatError(label + ": zstd stream is truncated (ends inside a frame)");
    }
  }
  return out;
}

// Undoes the transforms in the order listed (the reverse of the order applied).
std::string undo_transforms(std::string data, const StorageInfo& info, std::string_view fqn, const std::string& label,
                            const ItemOptions& options) {
  for (const std::string& d : info.transform_descriptors) {
    if (d == kZstd) {
      data = zstd_decompress(data, options.max_decompressed_bytes, label + " (" + d + ")");
    } else {
      throw FormatError("unknown transform '" + d + "' on item '" + std::string(fqn) + "'");
    }
  }
  return data;
}

// A source over the item's stored bytes: the native window type where there is one.
std::unique_ptr<ByteSource> window_of(const std::shared_ptr<const ByteSource>& distcp, const StorageInfo& info,
                                      std::string name) {
  if (const auto* file = dynamic_cast<const FileSource*>(distcp.get())) {
    return file->window(info.offset, info.length, std::move(name));
  }
  if (const auto* mapped = dynamic_cast<const MappedSource*>(distcp.get())) {
    return mapped->window(info.offset, info.length, std::move(name));
  }
  return std::make_unique<WindowSource>(distcp, info.offset, info.length, std::move(name));
}

}  // namespace

bool is_known_transform(std::string_view descriptor) { return descriptor == kZstd; }

std::string read_item_bytes(const ByteSource& distcp, const StorageInfo& info, std::string_view fqn,
                            const ItemOptions& options) {
  check_item_range(distcp, info, fqn);
  check_transforms(info, fqn);
  const std::string label = item_label(distcp, info, fqn);
  std::string stored = distcp.read_string(info.offset, info.length, label);
  return undo_transforms(std::move(stored), info, fqn, label, options);
}

std::unique_ptr<DistcpItem> DistcpItem::open(std::shared_ptr<const ByteSource> distcp, const StorageInfo& info,
                                             std::string fqn, const ItemOptions& options) {
  if (!distcp) throw UsageError("DistcpItem::open: no source for item '" + fqn + "'");
  check_item_range(*distcp, info, fqn);
  check_transforms(info, fqn);
  const std::string label = item_label(*distcp, info, fqn);
  std::unique_ptr<ByteSource> source;
  if (info.transform_descriptors.empty()) {
    source = window_of(distcp, info,
                       distcp->name() + "[" + std::to_string(info.offset) + "+" + std::to_string(info.length) +
                           "] (item '" + fqn + "')");
  } else {
    std::string stored = distcp->read_string(info.offset, info.length, label);
    source = std::make_unique<OwnedMemorySource>(undo_transforms(std::move(stored), info, fqn, label, options),
                                                 label + " decompressed");
  }
  // TorchFile's errors name the source, whose name carries the file, range and fqn.
  std::unique_ptr<torchfile::TorchFile> file = torchfile::TorchFile::open(std::move(source));
  return std::unique_ptr<DistcpItem>(new DistcpItem(std::move(fqn), info, std::move(file)));
}

const torchfile::TensorInfo& DistcpItem::tensor() const {
  const pickle::ValuePtr& root = file_->root();
  const torchfile::TensorInfo* t = root ? file_->tensor_of(*root) : nullptr;
  if (t == nullptr) {
    std::string found = root ? std::string(pickle::kind_name(root->kind())) : "nothing";
    if (root && root->is(pickle::Kind::kObject) && root->callable() && root->callable()->is(pickle::Kind::kGlobal)) {
      found = "a call of " + root->callable()->module() + "." + root->callable()->name();
    }
    throw FormatError(file_->source().name() + ": item '" + fqn_ +
                      "': expected a tensor at the root of the torch.save blob, found " + found);
  }
  return *t;
}

std::optional<torchfile::ByteRange> DistcpItem::storage_range_in_file(const torchfile::TensorInfo& tensor) const {
  if (transformed()) return std::nullopt;
  return torchfile::ByteRange{info_.offset + tensor.storage.offset, tensor.storage.size};
}

}  // namespace shardpoint::format
