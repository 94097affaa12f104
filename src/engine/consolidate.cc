#include "shardpoint/consolidate.h"

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/buffer_pool.h"
#include "core/kill_point.h"
#include "core/process_memory.h"
#include "engine/consolidate_validation.h"
#include "engine/consolidated_tree.h"
#include "engine/copy_memory_plan.h"
#include "engine/flatten.h"
#include "engine/lightning_layout.h"
#include "engine/shard_read_ahead.h"
#include "engine/slab_pipeline.h"
#include "engine/torch_file_crc.h"
#include "engine/zip_crc_ledger.h"
#include "format/safetensors_index.h"
#include "format/safetensors_writer.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/mutex.h"
#include "shardpoint/storage_registry.h"
#include "storage/local_storage.h"
#include "storage/temp_folder.h"
#include "storage/windowed_storage.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine {
namespace {

constexpr const char* kMetaPt = "meta.pt";
// Tensors whose blobs are announced to the kernel (WILLNEED) ahead of the one being read.
constexpr std::size_t kReadAheadTensors = 16;
// The slab is split into this many buffers, filled by kReaderThreads threads while this
// thread writes the filled ones in order: reads overlap writes and each other (more
// requests in flight on a cold disk or an object store).
constexpr std::size_t kSlabBuffers = 4;
// (One when the budget is small: each reader holds checksum-block scratch.)
constexpr std::size_t kReaderThreads = 2;

// os.path.splitext(file_name)[0]: torch.save's archive folder name for a file name.
std::string archive_name_for(const std::string& file_name) {
  std::string base = file_name;
  std::size_t lead = 0;
  while (lead < base.size() && base[lead] == '.') ++lead;
  auto dot = base.find_last_of('.');
  if (dot != std::string::npos && dot >= lead) base = base.substr(0, dot);
  for (unsigned char c : base) {
    if (c >= 0x80) return "archive";  // newer torch falls back to a stream for non-ASCII names
  }
  return base.empty() ? "archive" : base;
}

// One consolidate() call, in order:
//   1. validate the folder and the output (Lightning's checks) and open the input through
//      the shared header windows; check every shard file .metadata names;
//   2. split the memory budget and allocate the slab;
//   3. torch.save: build the tree (tensors as storage records "0", "1", ...), write
//      data.pkl, then stream every record; safetensors: choose the model tensors, group
//      them into files, stream each file, then write the index;
//   4. commit: the output writer's commit() (local: fsync + rename; object stores: the
//      upload completes), or TempFolder::publish for a folder of shards.
class Consolidator {
 public:
  Consolidator(const ConsolidateOptions& options, const std::function<void(const ConsolidateProgress&)>& progress)
      : options_(options), progress_(progress) {}

  ConsolidateReport run() {
    auto t0 = std::chrono::steady_clock::now();
    output_ = validate_consolidate(options_);
    const Location& folder = options_.checkpoint_folder;
    remote_in_ = folder.is_remote();
    remote_out_ = output_.is_remote();
    if (!remote_out_) check_output_parent();

    std::shared_ptr<storage::Storage> target;
    if (remote_in_) {
      storage::StorageOptions in_options;
      in_options.default_pool_bytes = 4096;  // never writes
      target = storage::open_storage(folder, in_options);
    } else {
      storage::StorageOptions in_options;
      in_options.max_mmaps = 0;  // pread: mapped shard pages would count in our RSS
      in_options.default_pool_bytes = 4096;
      target = storage::open_local_storage_at(folder.to_string(), in_options);
    }
    input_ = storage::make_windowed_storage(target);
    reader_ = std::make_unique<CheckpointReader>(*input_,
                                                 CheckpointReaderOptions{.verify_checksums = options_.verify_checksums,
                                                                         .check_zip_crc = options_.check_zip_crc});
    fqns_ = ordered_fqns(reader_->metadata(), reader_->metadata().key_order);
    // Before anything is written, so a broken folder fails early with one line.
    check_item_files(reader_->metadata(), *input_, remote_in_ ? std::string() : folder.to_string());
    if (!remote_in_) read_ahead_ = std::make_unique<ShardReadAhead>(reader_->metadata(), folder.to_string());
    plan_memory();

    if (options_.format == ConsolidateFormat::kSafetensors || options_.format == ConsolidateFormat::kHfSafetensors) {
      write_safetensors();
    } else {
      write_torch_save();
    }
    report_.output = output_;
    ReadCounts counts = reader_->counts();
    report_.bytes_read = counts.header_bytes + counts.data_bytes;
    report_.zip_crc = reader_->zip_crc_counts();
    report_.zip_crc += meta_zip_crc_;
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report_.peak_rss_bytes = process_peak_rss_bytes();
    return report_;
  }

 private:
  // Splits the budget (engine/copy_memory_plan.h) and allocates the slab.
  void plan_memory() {
    report_.base_rss_bytes = process_rss_bytes();
    CopyMemoryInputs in;
    in.budget = options_.memory_budget_bytes;
    in.base_rss = report_.base_rss_bytes;
    in.header_cache = storage::kWindowCacheBytes;
    in.remote_input = remote_in_;
    in.remote_output = remote_out_;
    in.slab_buffers = kSlabBuffers;
    in.max_readers = kReaderThreads;
    memory_ = plan_copy_memory(in);
    SlabPipelineOptions slab;
    slab.buffers = kSlabBuffers;
    slab.buffer_bytes = memory_.buffer_bytes;
    slab.readers = memory_.readers;
    slab.read_ahead = kReadAheadTensors;
    pipeline_ = std::make_unique<SlabPipeline>(slab);
    report_.slab_bytes = memory_.slab_bytes;
  }

  void check_cancel() const {
    if (options_.cancel != nullptr && options_.cancel->load() != 0) throw Cancelled();
  }

  void check_output_parent() const {
    const std::string parent = place_of_output(output_).parent.to_string();
    struct stat st {};
    if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound,
                         "cannot write \"" + output_.to_string() + "\": directory \"" + parent + "\" does not exist");
    }
  }

  // Opens meta.pt and, with the zip CRC-32 checks on, checks every record of it now: it is
  // small (the trainer's state) and read whole, and a damaged one must fail before any
  // output is written.
  void open_meta() {
    const std::string local_path = options_.checkpoint_folder.child(kMetaPt).to_string();
    const std::string name = remote_in_ ? input_->describe_key(kMetaPt) : local_path;
    const bool check = options_.verify_checksums && options_.check_zip_crc;
    meta_ = open_torch_file_naming_crc(
        [&]() -> std::unique_ptr<ByteSource> {
          if (remote_in_) return input_->open_source(kMetaPt);
          return MappedSource::open(local_path);
        },
        name, check);
    if (check) meta_zip_crc_ = check_records_but(meta_->archive(), "", 0, name);
  }

  // The storage the output goes to, rooted at `root` (a local folder or a URL prefix). Its
  // writers stage bytes in one pool sized by plan_memory() (object stores: upload parts).
  std::shared_ptr<storage::Storage> open_output_storage(const Location& root) {
    storage::StorageOptions out_options;
    BufferPoolOptions pool;
    pool.buffer_bytes = memory_.part_bytes;
    pool.capacity_bytes = memory_.pool_bytes;
    pool.huge_pages = false;
    out_options.buffer_pool = std::make_shared<BufferPool>(pool);
    if (remote_out_) return storage::open_storage(root, out_options);
    return storage::open_local_storage_at(root.to_string(), out_options);
  }

  // Announces the DCP tensors among sources_[seq[from..to)] to the kernel (local input).
  void advise(const std::vector<std::size_t>& seq, std::size_t from, std::size_t to) {
    if (!read_ahead_) return;
    std::vector<std::string> fqns;
    for (std::size_t i = from; i < to; ++i) {
      if (sources_[seq[i]].kind == TensorSourceKind::kDcpTensor) fqns.push_back(sources_[seq[i]].fqn);
    }
    read_ahead_->advise(fqns);
  }

  // Reads one piece of sources_[seq[piece.k]] into dest. Called from reader threads.
  void read_piece(const TensorSource& src, const SlabPiece& p, std::span<std::byte> dest) {
    if (src.kind == TensorSourceKind::kDcpTensor) {
      reader_->read_box(src.fqn, p.offsets, p.sizes, dest);
      return;
    }
    if (src.kind == TensorSourceKind::kObjectStorage) {
      // The item's archive is in memory; pieces start at multiples of the slab buffer size.
      torchfile::read_storage_bytes(*src.archive, src.storage, p.at, dest.first(static_cast<std::size_t>(p.n)));
      return;
    }
    // meta.pt tensors are small (trainer state); read whole, keep the piece's bytes.
    std::vector<std::byte> bytes(src.meta.nbytes());
    MutexLock lock(meta_mu_);
    meta_->read_tensor(src.meta, bytes);
    std::memcpy(dest.data(), bytes.data() + p.at, static_cast<std::size_t>(p.n));
  }

  // Streams the bytes of sources_[seq[0]], sources_[seq[1]], ... (each row-major) to the
  // caller through the slab pipeline: begin(k) before source seq[k], write(span) for each
  // piece, end(k) after it. DCP tensors are read box by box (CheckpointReader::read_box),
  // object items' storages by byte range from their archives,
  // meta.pt tensors by byte range. Progress is reported and cancellation checked after
  // each slab buffer.
  void stream_sources(const std::vector<std::size_t>& seq, const std::function<void(std::size_t)>& begin,
                      const std::function<void(std::span<const std::byte>)>& write,
                      const std::function<void(std::size_t)>& end) {
    std::vector<SlabTensor> tensors;
    tensors.reserve(seq.size());
    for (std::size_t i : seq) {
      const TensorSource& src = sources_[i];
      tensors.push_back(SlabTensor{src.shape, dtype_itemsize(src.dtype), src.kind == TensorSourceKind::kDcpTensor});
    }
    SlabCallbacks callbacks;
    callbacks.read = [&](const SlabPiece& p, std::span<std::byte> dest) { read_piece(sources_[seq[p.k]], p, dest); };
    callbacks.announce = [&](std::size_t from, std::size_t to) { advise(seq, from, to); };
    callbacks.begin = begin;
    callbacks.write = [&](std::span<const std::byte> data) {
      write(data);
      done_ += data.size();
    };
    callbacks.end = end;
    callbacks.after_buffer = [&] {
      if (progress_) progress_(ConsolidateProgress{done_, total_});
      check_cancel();
    };
    pipeline_->run(tensors, callbacks);
  }

  void write_torch_save() {
    ConsolidatedTree tree =
        build_consolidated_tree(*reader_, fqns_, options_.layout, [&]() -> const torchfile::TorchFile* {
          // kDcp: a Lightning folder's trainer state is kept (validation made the others check).
          if (options_.layout == ConsolidateLayout::kDcp && !input_->try_stat(kMetaPt)) return nullptr;
          open_meta();
          return meta_.get();
        });
    report_.objects = tree.objects;
    sources_ = std::move(tree.tensors);
    std::vector<std::size_t> order(sources_.size());  // storage key k is sources_[k]
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    for (const TensorSource& src : sources_) total_ += src.nbytes();
    if (progress_) progress_(ConsolidateProgress{0, total_});

    const OutputPlace place = place_of_output(output_);
    auto out = open_output_storage(place.parent);
    storage::WriteOptions wo;
    wo.durable = options_.durable;
    auto sink = out->open_writer(place.name, wo);
    torchfile::TorchSaveOptions so;
    so.archive_name = archive_name_for(place.name);
    // Records start at page multiples (torch.load takes any alignment; torch.save uses 64),
    // so page-aligned slabs go from our buffer to the O_DIRECT file without a staging copy.
    so.zip.alignment = kSlabPage;
    torchfile::TorchSaveWriter writer(*sink, so);
    writer.write_pickle(*tree.root);
    stream_sources(
        order, [&](std::size_t k) { writer.begin_storage(std::to_string(k), sources_[k].nbytes()); },
        [&](std::span<const std::byte> data) { writer.write(data); },
        [&](std::size_t k) {
          writer.end_storage();
          ++report_.tensors;
          report_.tensor_bytes += sources_[k].nbytes();
        });
    writer.finish();
    check_cancel();
    kill_point(KillPoint::kPublish);  // the output complete under its temporary name
    sink->commit();
  }

  void write_safetensors() {
    const format::Metadata& md = reader_->metadata();
    std::string module_key;  // the subtree of the weights: "model" or "state_dict"
    if (options_.layout != ConsolidateLayout::kDcp) {
      // meta.pt only to report Lightning's errors on the layout the same way.
      open_meta();
      module_key = model_key(require_lightning_layout(md));
    }
    std::vector<std::pair<format::SafetensorsEntry, std::size_t>> tensors;
    for (const std::string& fqn : fqns_) {
      const auto* t = std::get_if<format::TensorStorageMetadata>(&md.state_dict_metadata.at(fqn));
      format::ObjectPath path = object_path_of(md, fqn);
      if (options_.layout != ConsolidateLayout::kDcp) {
        const auto* first = std::get_if<std::string>(&path.front());
        if (first == nullptr || *first != module_key) continue;
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
    for (const auto& [e, _] : tensors) total_ += e.nbytes();
    if (progress_) progress_(ConsolidateProgress{0, total_});

    std::vector<std::uint64_t> sizes;
    for (const auto& [e, _] : tensors) sizes.push_back(e.nbytes());
    const std::vector<std::vector<std::size_t>> files = format::group_into_shards(sizes, options_.max_shard_bytes);

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

    if (options_.max_shard_bytes == 0 && options_.format == ConsolidateFormat::kSafetensors) {
      const OutputPlace place = place_of_output(output_);
      auto out = open_output_storage(place.parent);
      write_file(*out, place.name, files.front());
      return;
    }
    // A folder of shards + index. Local: built in a temporary folder renamed at the end.
    // Object store: shard objects first, the index last (a reader that finds the index
    // finds every shard); on failure the shards already committed are removed.
    std::optional<storage::TempFolder> tmp;
    if (!remote_out_) tmp.emplace(output_.to_string());
    auto out = open_output_storage(remote_out_ ? output_ : Location::parse(tmp->path()));
    std::vector<std::string> written;
    try {
      std::map<std::string, std::string> weight_map;
      for (std::size_t f = 0; f < files.size(); ++f) {
        const std::string name = format::safetensors_shard_name(f, files.size());
        write_file(*out, name, files[f]);
        written.push_back(name);
        for (std::size_t i : files[f]) weight_map[tensors[i].first.name] = name;
      }
      const std::string text = format::safetensors_index_json(total_, weight_map);
      storage::WriteOptions wo;
      wo.durable = options_.durable;
      check_cancel();
      out->write_atomic(format::kSafetensorsIndexName, as_bytes(text), wo);
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

  const ConsolidateOptions& options_;
  const std::function<void(const ConsolidateProgress&)>& progress_;
  Location output_;
  std::shared_ptr<storage::Storage> input_;
  std::unique_ptr<CheckpointReader> reader_;
  std::unique_ptr<torchfile::TorchFile> meta_;
  ZipCrcCounts meta_zip_crc_;                   // open_meta()'s checks
  std::vector<std::string> fqns_;               // every key of state_dict_metadata, in the pickled order
  bool remote_in_ = false;                      // the checkpoint is an object-store URL
  bool remote_out_ = false;                     // the output is an object-store URL
  std::unique_ptr<ShardReadAhead> read_ahead_;  // local input only
  Mutex meta_mu_;                               // serializes reads through meta_ (a TorchFile's reads share its source)
  std::vector<TensorSource> sources_;           // the tensors streamed to the output
  CopyMemoryPlan memory_;
  std::unique_ptr<SlabPipeline> pipeline_;
  std::uint64_t done_ = 0;
  std::uint64_t total_ = 0;
  ConsolidateReport report_;
};

}  // namespace

ConsolidateReport consolidate(const ConsolidateOptions& options,
                              const std::function<void(const ConsolidateProgress&)>& progress) {
  if (options.memory_budget_bytes == 0) throw UsageError("consolidate: memory budget must be > 0");
  Consolidator c(options, progress);
  return c.run();
}

}  // namespace shardpoint::engine
