// Writing one save item. The tensor bytes go from the caller's buffer through the
// checksumming sink to the storage writer in slices (ItemWriteOptions::slice_bytes); the
// only copies are the storage writer's staging buffers (none for borrowed bytes on an
// object store: ItemWriteOptions::borrow_values).
#include "engine/item_writer.h"

#include <algorithm>
#include <optional>

#include "engine/block_checksum.h"
#include "engine/chunking.h"
#include "format/stream_transform.h"
#include "format/zstd_writer.h"
#include "shardpoint/error.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_save_writer.h"
#include "torchfile/tree_storages.h"

namespace shardpoint::engine {

namespace {

// Forwards to the file and checksums what passes; position() counts this blob's bytes.
class ChecksummingSink final : public ByteSink {
 public:
  ChecksummingSink(ByteSink& target, BlockChecksummer& sum) : target_(target), sum_(sum) {}
  void write(ByteSpan data) override {
    target_.write(data);
    sum_.update(data);
  }
  void write_borrowed(ByteSpan data) override {
    target_.write_borrowed(data);
    sum_.update(data);
  }
  using ByteSink::write;
  std::uint64_t position() const override { return sum_.length(); }

 private:
  ByteSink& target_;
  BlockChecksummer& sum_;
};

// Where a blob's bytes go: through the checksumming sink into the file, compressed into
// one zstd frame on the way when options.compression asks (docs/dcp-format.md §2.4); the
// checksums then cover the stored (compressed) bytes.
class BlobOutput {
 public:
  BlobOutput(ByteSink& file, const std::string& file_name, const ItemWriteOptions& options, WrittenItem& out)
      : sum_(options.checksum, options.block_size), checksummed_(file, sum_), out_(out) {
    out_.info.relative_path = file_name;
    out_.info.offset = file.position();
    if (options.compression == Compression::kZstd) {
      zstd_.emplace(checksummed_, options.zstd_level, options.zstd_workers);
    }
  }
  // The sink the blob is written to; position() counts the blob's (uncompressed) bytes.
  ByteSink& sink() { return zstd_ ? static_cast<ByteSink&>(*zstd_) : checksummed_; }
  // Ends the blob and fills out's length, checksums and transforms.
  void finish() {
    if (zstd_) {
      zstd_->finish();
      out_.info.transform_descriptors = format::transform_descriptors(format::StreamTransform::kZstd);
      out_.data_offset.reset();  // a zstd item has no data offset a reader could seek to
    }
    out_.info.length = sum_.length();
    out_.checksum = sum_.finish_item();
    out_.blocks = sum_.take_blocks();
  }

 private:
  BlockChecksummer sum_;
  ChecksummingSink checksummed_;
  std::optional<format::ZstdWriter> zstd_;
  WrittenItem& out_;
};

[[noreturn]] void mismatch(const WriteItem& item, const std::string& detail) {
  throw UsageError("save: item \"" + item.index.fqn + "\": " + detail);
}

// The shard must be the planned chunk: its dtype, box and byte count.
void check_shard(const WriteItem& item, const TensorShard& shard) {
  if (shard.dtype != item.dtype) {
    mismatch(item, std::string("expected dtype ") + std::string(dtype_name(item.dtype)) + ", found " +
                       std::string(dtype_name(shard.dtype)));
  }
  if (shard.sizes != item.chunk.sizes || shard.offsets != item.chunk.offsets) {
    mismatch(item, "expected the box " + box_to_string(item.chunk.offsets, item.chunk.sizes) + ", found " +
                       box_to_string(shard.offsets, shard.sizes));
  }
  if (shard.data.size() != item.nbytes || (item.nbytes > 0 && shard.data.data() == nullptr)) {
    mismatch(item, "expected " + std::to_string(item.nbytes) + " bytes of tensor data, found " +
                       std::to_string(shard.data.size()) + (shard.data.data() == nullptr ? " (no buffer)" : ""));
  }
}

}  // namespace

WrittenItem write_item(ByteSink& file, const std::string& file_name, const WriteItem& item, const FlatValue& value,
                       const ItemWriteOptions& options) {
  if (item.type == WriteItemType::kTensor) {
    const auto* shard = std::get_if<TensorShard>(&value);
    if (shard == nullptr) mismatch(item, "planned as a tensor, found an object");
    check_shard(item, *shard);
    return write_tensor_item(
        file, file_name, item,
        [&](const std::function<void(ByteSpan)>& write) { write(ByteSpan(shard->data.data(), shard->data.size())); },
        options);
  }
  const auto* object = std::get_if<pickle::ValuePtr>(&value);
  if (object == nullptr) mismatch(item, "planned as an object, found a tensor");
  WrittenItem out;
  out.index = item.index;
  BlobOutput blob(file, file_name, options, out);
  torchfile::TorchSaveWriter writer(blob.sink());
  const pickle::ValuePtr& v = *object ? *object : pickle::Value::none();
  writer.write_pickle(*v);
  writer.finish();
  blob.finish();
  return out;
}

WrittenItem write_object_item(ByteSink& file, const std::string& file_name, const WriteItem& item,
                              const pickle::Value& object, const torchfile::TorchFile& archive,
                              const ItemWriteOptions& options) {
  if (item.type != WriteItemType::kBytes) mismatch(item, "planned as a tensor, found an object");
  WrittenItem out;
  out.index = item.index;
  BlobOutput blob(file, file_name, options, out);
  torchfile::TorchSaveWriter writer(blob.sink());
  torchfile::write_object_with_storages(writer, object, archive);
  writer.finish();
  blob.finish();
  return out;
}

WrittenItem write_tensor_item(ByteSink& file, const std::string& file_name, const WriteItem& item,
                              const TensorBytesProducer& produce, const ItemWriteOptions& options) {
  if (item.type != WriteItemType::kTensor) mismatch(item, "planned as an object, written as a tensor");
  WrittenItem out;
  out.index = item.index;
  BlobOutput blob(file, file_name, options, out);
  torchfile::TorchSaveWriter writer(blob.sink());
  const std::size_t itemsize = dtype_itemsize(item.dtype);
  const std::uint64_t numel = itemsize == 0 ? 0 : item.nbytes / itemsize;
  const std::vector<std::int64_t> strides = torchfile::contiguous_strides(item.chunk.sizes);
  pickle::ValuePtr root = torchfile::make_tensor_node(item.dtype, item.chunk.sizes, strides, 0, "0", numel, "cpu",
                                                      /*requires_grad=*/false);
  writer.write_pickle(*root);
  writer.begin_storage("0", item.nbytes);
  out.data_offset = blob.sink().position();
  const std::size_t slice_bytes = std::max<std::size_t>(options.slice_bytes, 1);
  std::uint64_t produced = 0;
  produce([&](ByteSpan data) {
    produced += data.size();
    if (produced > item.nbytes) {
      mismatch(item, "expected " + std::to_string(item.nbytes) + " bytes of tensor data, the producer gave more");
    }
    while (!data.empty()) {
      const std::size_t n = std::min(slice_bytes, data.size());
      if (options.borrow_values) {
        writer.write_borrowed(data.first(n));
      } else {
        writer.write(data.first(n));
      }
      data = data.subspan(n);
    }
  });
  if (produced != item.nbytes) {
    mismatch(item,
             "expected " + std::to_string(item.nbytes) + " bytes of tensor data, found " + std::to_string(produced));
  }
  writer.end_storage();
  writer.finish();
  blob.finish();
  return out;
}

WrittenItem write_serialized_item(ByteSink& file, const std::string& file_name, const format::MetadataIndex& index,
                                  ByteSpan blob, const ItemWriteOptions& options) {
  WrittenItem out;
  out.index = index;
  BlobOutput output(file, file_name, options, out);
  const std::size_t slice_bytes = std::max<std::size_t>(options.slice_bytes, 1);
  while (!blob.empty()) {
    const std::size_t n = std::min(slice_bytes, blob.size());
    if (options.borrow_values) {
      output.sink().write_borrowed(blob.first(n));
    } else {
      output.sink().write(blob.first(n));
    }
    blob = blob.subspan(n);
  }
  output.finish();
  return out;
}

}  // namespace shardpoint::engine
