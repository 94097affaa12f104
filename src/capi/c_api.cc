// The C API (include/shardpoint/c_api.h) over the engine: locations, objects, saves, loads
// and the planned I/O of PyTorch DCP's plans. Converts C arguments into engine values, runs
// the call, and turns every exception into an sp_status and a message (c_api_util.h). The
// tools are in c_api_tools.cc and c_api_inspect.cc, the checkpoint-folder rules in c_api_files.cc.
#include "shardpoint/c_api.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "capi/c_api_util.h"
#include "core/streaming_copy.h"
#include "engine/chunking.h"
#include "engine/planned_io.h"
#include "engine/save_plan.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/state_dict.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/local_replace.h"

struct sp_checkpoint {
  std::unique_ptr<shardpoint::storage::Storage> storage;
};

struct sp_reader {
  std::unique_ptr<shardpoint::engine::PlannedReader> reader;
};

namespace {

using namespace shardpoint;
using namespace shardpoint::capi;
using format::Shape;

DType dtype_of(const char* name, const std::string& fqn) {
  require(name != nullptr, "dtype is NULL");
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype) throw UsageError("item \"" + fqn + "\": unsupported dtype \"" + std::string(name) + "\"");
  return *dtype;
}

Shape shape_of(const int64_t* dims, int ndim, const char* what) {
  require(ndim >= 0, "ndim < 0");
  require(ndim == 0 || dims != nullptr, what);
  return Shape(dims, dims + ndim);
}

engine::SaveOptions save_options_of(const sp_save_options* in) {
  sp_save_options o;
  sp_save_options_init(&o);
  if (in != nullptr) std::memcpy(&o, in, std::min(in->struct_size, sizeof(o)));
  engine::SaveOptions out;
  out.thread_count = std::max(o.thread_count, 1);
  switch (o.checksum) {
    case SP_CHECKSUM_NONE: out.checksum = engine::ChecksumAlgorithm::kNone; break;
    case SP_CHECKSUM_CRC32C: out.checksum = engine::ChecksumAlgorithm::kCrc32c; break;
    case SP_CHECKSUM_XXH3: out.checksum = engine::ChecksumAlgorithm::kXxh3; break;
    default: throw UsageError("save options: unknown checksum " + std::to_string(o.checksum));
  }
  require(o.checksum_block_bytes > 0, "save options: checksum_block_bytes must be > 0");
  out.checksum_block_bytes = o.checksum_block_bytes;
  out.durable = o.durable != 0;
  out.direct_io = o.direct_io != 0;
  switch (o.compression) {
    case SP_COMPRESSION_NONE: out.compression = engine::Compression::kNone; break;
    case SP_COMPRESSION_ZSTD: out.compression = engine::Compression::kZstd; break;
    default: throw UsageError("save options: unknown compression " + std::to_string(o.compression));
  }
  require(o.compression_level >= 1 && o.compression_level <= 19, "save options: compression_level must be 1..19");
  out.compression_level = o.compression_level;
  require(o.compression_threads >= 0, "save options: compression_threads must be >= 0");
  out.compression_threads = o.compression_threads;
  return out;
}

// What an sp_write_result points into: the engine's records, and the arrays of their views.
struct WriteResultOwner {
  std::vector<engine::WrittenItem> written;
  std::vector<std::vector<const char*>> descriptors;  // one per item
  std::vector<sp_written_item> items;

  // Fills descriptors and items from written (once; nothing grows after).
  void fill() {
    descriptors.resize(written.size());
    items.reserve(written.size());
    for (std::size_t i = 0; i < written.size(); ++i) {
      const engine::WrittenItem& w = written[i];
      sp_written_item out{};
      out.kind = w.index.offset ? SP_ITEM_TENSOR : SP_ITEM_BYTES;
      out.fqn = w.index.fqn.c_str();
      if (w.index.offset) {
        out.ndim = static_cast<int>(w.index.offset->size());
        out.offsets = w.index.offset->data();
      }
      out.storage = storage_info_view(w.info, descriptors[i]);
      out.checksum = w.checksum;
      out.block_count = w.blocks.size();
      out.blocks = w.blocks.empty() ? nullptr : w.blocks.data();
      out.has_data_offset = w.data_offset ? 1 : 0;
      out.data_offset = w.data_offset.value_or(0);
      items.push_back(out);
    }
  }
};

// The caller's record as the engine's.
engine::WrittenItem written_item_of(const sp_written_item& in) {
  engine::WrittenItem out;
  out.index.fqn = str(in.fqn, "written item fqn is NULL");
  const std::string what = "written item \"" + out.index.fqn + "\"";
  if (in.kind == SP_ITEM_TENSOR) {
    out.index.offset = shape_of(in.offsets, in.ndim, "written item offsets is NULL");
  } else if (in.kind != SP_ITEM_BYTES) {
    throw UsageError(what + ": unknown kind " + std::to_string(in.kind));
  }
  out.info = storage_info_of(in.storage, what);
  out.checksum = in.checksum;
  require(in.blocks != nullptr || in.block_count == 0, "written item blocks is NULL");
  out.blocks.assign(in.blocks, in.blocks + in.block_count);
  if (in.has_data_offset != 0) out.data_offset = in.data_offset;
  return out;
}

}  // namespace

extern "C" {

const char* sp_version(void) { return "0.1.0"; }

void sp_free(void* p) { std::free(p); }

void sp_copy_ranges(void* const* dsts, const void* const* srcs, const uint64_t* sizes, size_t count) {
  for (size_t i = 0; i < count; ++i) core::streaming_copy(dsts[i], srcs[i], sizes[i]);
}

sp_status sp_location_parse(const char* path_or_url, int* remote, char** canonical, char** parent, char** name,
                            char** error) {
  return guarded(error, [&] {
    require(remote != nullptr && canonical != nullptr && parent != nullptr && name != nullptr, "NULL argument");
    const Location location = Location::parse(str(path_or_url, "path_or_url is NULL"));
    const std::optional<Location> up = location.parent();
    std::unique_ptr<char, decltype(&std::free)> text(copy_string(location.to_string()), &std::free);
    std::unique_ptr<char, decltype(&std::free)> folder(copy_string(up ? up->to_string() : ""), &std::free);
    std::unique_ptr<char, decltype(&std::free)> last(copy_string(location.name()), &std::free);
    if (!text || !folder || !last) throw std::bad_alloc();
    *remote = location.is_remote() ? 1 : 0;
    *canonical = text.release();
    *parent = folder.release();
    *name = last.release();
  });
}

sp_status sp_checkpoint_open(const char* path_or_url, sp_checkpoint** out, char** error) {
  return guarded(error, [&] {
    require(out != nullptr, "out is NULL");
    auto handle = std::make_unique<sp_checkpoint>();
    handle->storage = storage::open_storage(location_arg(path_or_url, "path_or_url is NULL"));
    *out = handle.release();
  });
}

void sp_checkpoint_close(sp_checkpoint* checkpoint) { delete checkpoint; }

int sp_checkpoint_files_per_rank(const sp_checkpoint* checkpoint, int thread_count) {
  const int asked = std::max(thread_count, 1);
  if (checkpoint == nullptr || checkpoint->storage == nullptr) return asked;
  return engine::files_per_rank(asked, checkpoint->storage->features());
}

sp_status sp_read_object(sp_checkpoint* checkpoint, const char* key, void** data, size_t* size, int* found,
                         char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr && data != nullptr && size != nullptr && found != nullptr, "NULL argument");
    *data = nullptr;
    *size = 0;
    *found = 0;
    std::optional<std::string> bytes = checkpoint->storage->try_read_all(str(key, "key is NULL"));
    if (!bytes) return;
    void* p = std::malloc(std::max<std::size_t>(bytes->size(), 1));
    if (p == nullptr) throw std::bad_alloc();
    std::memcpy(p, bytes->data(), bytes->size());
    *data = p;
    *size = bytes->size();
    *found = 1;
  });
}

sp_status sp_write_object(sp_checkpoint* checkpoint, const char* key, const void* data, size_t size, int durable,
                          char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr && (data != nullptr || size == 0), "NULL argument");
    storage::WriteOptions options;
    options.durable = durable != 0;
    options.direct_io = false;
    checkpoint->storage->write_atomic(str(key, "key is NULL"), ByteSpan(static_cast<const std::byte*>(data), size),
                                      options);
  });
}

sp_status sp_remove_object(sp_checkpoint* checkpoint, const char* key, char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr, "checkpoint is NULL");
    checkpoint->storage->remove(str(key, "key is NULL"));
  });
}

sp_status sp_replace_folder(const char* staged, const char* target, int durable, char** error) {
  return guarded(error, [&] {
    const Location from = Location::parse(str(staged, "staged is NULL"));
    const Location to = Location::parse(str(target, "target is NULL"));
    for (const Location* p : {&from, &to}) {
      if (p->is_remote()) {
        throw UsageError("replace folder: \"" + p->text() + "\" is a URL; only local folders can be exchanged");
      }
    }
    storage::replace_local_folder(from.path(), to.path(), durable != 0);
  });
}

void sp_save_options_init(sp_save_options* options) {
  if (!reset_sized(options)) return;
  const engine::SaveOptions d;  // the defaults are the engine's
  options->thread_count = d.thread_count;
  options->checksum = checksum_value(d.checksum);
  options->checksum_block_bytes = d.checksum_block_bytes;
  options->durable = d.durable ? 1 : 0;
  options->direct_io = d.direct_io ? 1 : 0;
  options->compression = d.compression == engine::Compression::kZstd ? SP_COMPRESSION_ZSTD : SP_COMPRESSION_NONE;
  options->compression_level = d.compression_level;
  options->compression_threads = d.compression_threads;
}

void sp_write_result_init(sp_write_result* result) { reset_sized(result); }

void sp_write_result_free(sp_write_result* result) {
  if (result == nullptr || result->struct_size < offsetof(sp_write_result, owner) + sizeof(void*)) return;
  delete static_cast<WriteResultOwner*>(result->owner);
  result->owner = nullptr;
  if (result->struct_size >= offsetof(sp_write_result, items) + sizeof(void*)) {
    result->item_count = 0;
    result->items = nullptr;
  }
}

sp_status sp_write_items(sp_checkpoint* checkpoint, const sp_item* items, size_t count, const sp_save_options* options,
                         sp_write_result* result, char** error) {
  return guarded(error, [&] {
    require(result != nullptr, "result is NULL");
    require(result->struct_size >= offsetof(sp_write_result, owner) + sizeof(void*), "result struct_size too small");
    write_result(result, sp_write_result{});  // holds nothing until the call succeeds
    require(checkpoint != nullptr && (items != nullptr || count == 0), "NULL argument");
    const engine::SaveOptions save = save_options_of(options);
    std::vector<engine::PlannedFile> files;
    std::map<std::string, std::size_t> position;
    for (std::size_t i = 0; i < count; ++i) {
      const sp_item& in = items[i];
      const std::string file = str(in.file, "item file is NULL");
      auto [it, added] = position.emplace(file, files.size());
      if (added) files.push_back({file, {}});
      engine::PlannedItem item;
      item.index.fqn = str(in.fqn, "item fqn is NULL");
      require(in.data != nullptr || in.nbytes == 0, "item data is NULL");
      item.bytes = ByteSpan(static_cast<const std::byte*>(in.data), in.nbytes);
      if (in.kind == SP_ITEM_TENSOR) {
        item.type = engine::WriteItemType::kTensor;
        item.dtype = dtype_of(in.dtype, item.index.fqn);
        item.sizes = shape_of(in.sizes, in.ndim, "item sizes is NULL");
        item.index.offset = shape_of(in.offsets, in.ndim, "item offsets is NULL");
      } else if (in.kind == SP_ITEM_BYTES) {
        item.type = engine::WriteItemType::kBytes;
      } else {
        throw UsageError("item \"" + item.index.fqn + "\": unknown kind " + std::to_string(in.kind));
      }
      files[it->second].items.push_back(std::move(item));
    }
    auto owner = std::make_unique<WriteResultOwner>();
    owner->written = engine::write_planned_files(*checkpoint->storage, files, save);
    owner->fill();
    sp_write_result full{};
    full.item_count = owner->items.size();
    full.items = owner->items.empty() ? nullptr : owner->items.data();
    full.owner = owner.release();
    write_result(result, full);
  });
}

sp_status sp_commit(sp_checkpoint* checkpoint, const void* metadata, size_t metadata_size,
                    const sp_written_item* written, size_t written_count, const sp_save_options* options,
                    char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr && metadata != nullptr && (written != nullptr || written_count == 0),
            "NULL argument");
    std::vector<engine::WrittenItem> items;
    items.reserve(written_count);
    for (std::size_t i = 0; i < written_count; ++i) items.push_back(written_item_of(written[i]));
    engine::commit_planned(*checkpoint->storage, std::string_view(static_cast<const char*>(metadata), metadata_size),
                           items, save_options_of(options));
  });
}

void sp_reader_options_init(sp_reader_options* options) {
  if (!reset_sized(options)) return;
  const engine::LoadOptions d;  // the defaults are the engine's
  options->verify_checksums = d.verify_checksums ? 1 : 0;
  options->thread_count = d.thread_count;
  options->check_zip_crc = d.check_zip_crc ? 1 : 0;
}

sp_status sp_reader_open(sp_checkpoint* checkpoint, const sp_reader_options* options, sp_reader** out, char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr && out != nullptr, "NULL argument");
    sp_reader_options o;
    sp_reader_options_init(&o);
    if (options != nullptr) std::memcpy(&o, options, std::min(options->struct_size, sizeof(o)));
    engine::PlannedReaderOptions ro;
    ro.verify_checksums = o.verify_checksums != 0;
    ro.check_zip_crc = o.check_zip_crc != 0;
    ro.thread_count = std::max(o.thread_count, 1);
    auto handle = std::make_unique<sp_reader>();
    handle->reader = std::make_unique<engine::PlannedReader>(*checkpoint->storage, ro);
    *out = handle.release();
  });
}

void sp_reader_close(sp_reader* reader) { delete reader; }

void sp_reader_metadata(const sp_reader* reader, const void** data, size_t* size) {
  if (reader == nullptr || data == nullptr || size == nullptr) return;
  *data = reader->reader->metadata_bytes().data();
  *size = reader->reader->metadata_bytes().size();
}

}  // extern "C"

namespace {

// A malloc'd copy of bytes into *data / *size (1 byte allocated for empty input).
void give_bytes(std::string_view bytes, void** data, size_t* size) {
  void* p = std::malloc(std::max<std::size_t>(bytes.size(), 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, bytes.data(), bytes.size());
  *data = p;
  *size = bytes.size();
}

}  // namespace

extern "C" {

sp_status sp_reader_metadata_rebuilt(const sp_reader* reader, void** data, size_t* size, char** error) {
  return guarded(error, [&] {
    require(reader != nullptr && data != nullptr && size != nullptr, "NULL argument");
    give_bytes(format::encode_metadata(reader->reader->metadata()), data, size);
  });
}

sp_status sp_metadata_rebuild(const void* metadata, size_t metadata_size, const char* source_name, void** data,
                              size_t* size, char** error) {
  return guarded(error, [&] {
    require((metadata != nullptr || metadata_size == 0) && data != nullptr && size != nullptr, "NULL argument");
    const format::Metadata decoded = format::decode_metadata(
        ByteSpan(static_cast<const std::byte*>(metadata), metadata_size), str(source_name, "source_name is NULL"));
    give_bytes(format::encode_metadata(decoded), data, size);
  });
}

int sp_reader_verified(const sp_reader* reader) { return reader != nullptr && reader->reader->verified() ? 1 : 0; }

int sp_reader_checks_zip_crc(const sp_reader* reader) {
  return reader != nullptr && reader->reader->checks_zip_crc() ? 1 : 0;
}

void sp_reader_zip_crc_counts(const sp_reader* reader, uint64_t* records_checked, uint64_t* records_partial,
                              uint64_t* records_no_checksum) {
  if (reader == nullptr) return;
  const engine::ZipCrcCounts c = reader->reader->zip_crc_counts();
  if (records_checked != nullptr) *records_checked = c.records_checked;
  if (records_partial != nullptr) *records_partial = c.records_partial;
  if (records_no_checksum != nullptr) *records_no_checksum = c.records_no_checksum;
}

sp_status sp_reader_read_tensors(sp_reader* reader, const sp_tensor_read* reads, size_t count, char** error) {
  return guarded(error, [&] {
    require(reader != nullptr && (reads != nullptr || count == 0), "NULL argument");
    std::vector<engine::PlannedTensorRead> requests(count);
    for (std::size_t i = 0; i < count; ++i) {
      const sp_tensor_read& in = reads[i];
      engine::PlannedTensorRead& r = requests[i];
      r.fqn = str(in.fqn, "read fqn is NULL");
      r.blob = format::StorageInfo{str(in.file, "read file is NULL"), in.blob_offset, in.blob_length, {}};
      r.dtype = dtype_of(in.dtype, r.fqn);
      r.chunk.offsets = shape_of(in.chunk_offsets, in.ndim, "chunk_offsets is NULL");
      r.chunk.sizes = shape_of(in.chunk_sizes, in.ndim, "chunk_sizes is NULL");
      r.storage_offsets = shape_of(in.storage_offsets, in.ndim, "storage_offsets is NULL");
      r.lengths = shape_of(in.lengths, in.ndim, "lengths is NULL");
      std::uint64_t expected = dtype_itemsize(r.dtype);
      for (std::int64_t d : r.lengths) expected *= static_cast<std::uint64_t>(std::max<std::int64_t>(d, 0));
      if (expected != in.dest_nbytes || (expected > 0 && in.dest == nullptr)) {
        throw UsageError("read of \"" + r.fqn + "\": the destination holds " + std::to_string(in.dest_nbytes) +
                         " bytes, the box needs " + std::to_string(expected));
      }
      r.dest = std::span<std::byte>(static_cast<std::byte*>(in.dest), in.dest_nbytes);
    }
    reader->reader->read_tensors(requests);
  });
}

sp_status sp_reader_read_blob(sp_reader* reader, const char* file, uint64_t offset, uint64_t length, const char* fqn,
                              void** data, size_t* size, char** error) {
  return guarded(error, [&] {
    require(reader != nullptr && data != nullptr && size != nullptr, "NULL argument");
    std::string bytes = reader->reader->read_blob(format::StorageInfo{str(file, "file is NULL"), offset, length, {}},
                                                  str(fqn, "fqn is NULL"));
    void* p = std::malloc(std::max<std::size_t>(bytes.size(), 1));
    if (p == nullptr) throw std::bad_alloc();
    std::memcpy(p, bytes.data(), bytes.size());
    *data = p;
    *size = bytes.size();
  });
}

}  // extern "C"

namespace {

// The state of sp_save / sp_load: a flat dict fqn -> tensor box over the caller's buffers.
engine::StateNode state_of(const sp_tensor* tensors, size_t count) {
  require(tensors != nullptr || count == 0, "tensors is NULL");
  engine::StateDict dict;
  for (std::size_t i = 0; i < count; ++i) {
    const sp_tensor& t = tensors[i];
    engine::TensorShard shard;
    const std::string fqn = str(t.fqn, "tensor fqn is NULL");
    shard.dtype = dtype_of(t.dtype, fqn);
    shard.global_shape = shape_of(t.global_shape, t.ndim, "global_shape is NULL");
    shard.offsets = shape_of(t.offsets, t.ndim, "offsets is NULL");
    shard.sizes = shape_of(t.sizes, t.ndim, "sizes is NULL");
    require(t.data != nullptr || t.nbytes == 0, "tensor data is NULL");
    shard.data = std::span<std::byte>(static_cast<std::byte*>(t.data), t.nbytes);
    dict.emplace_back(fqn, engine::StateNode(std::move(shard)));
  }
  return engine::StateNode(std::move(dict));
}

}  // namespace

extern "C" {

sp_status sp_save(sp_checkpoint* checkpoint, const sp_tensor* tensors, size_t count, const sp_save_options* options,
                  char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr, "checkpoint is NULL");
    const engine::StateNode state = state_of(tensors, count);
    std::unique_ptr<comm::Communicator> comm = comm::make_communicator_from_env();
    engine::save(state, *checkpoint->storage, *comm, save_options_of(options));
  });
}

sp_status sp_load(sp_checkpoint* checkpoint, const sp_tensor* tensors, size_t count, const sp_reader_options* options,
                  char** error) {
  return guarded(error, [&] {
    require(checkpoint != nullptr, "checkpoint is NULL");
    sp_reader_options o;
    sp_reader_options_init(&o);
    if (options != nullptr) std::memcpy(&o, options, std::min(options->struct_size, sizeof(o)));
    engine::LoadOptions lo;
    lo.verify_checksums = o.verify_checksums != 0;
    lo.check_zip_crc = o.check_zip_crc != 0;
    lo.thread_count = std::max(o.thread_count, 1);
    engine::StateNode state = state_of(tensors, count);
    std::unique_ptr<comm::Communicator> comm = comm::make_communicator_from_env();
    engine::load(state, *checkpoint->storage, *comm, lo);
  });
}

}  // extern "C"
