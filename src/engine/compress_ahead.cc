#include "engine/compress_ahead.h"

#include <algorithm>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <utility>

#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// Items up to this size are compressed whole into memory; larger ones stream to the file
// (holding a multi-GiB embedding's frame in memory would double its footprint). 64 MiB:
// a 4096 x 4096 float32 matrix.
constexpr std::uint64_t kWholeItemBytes = std::uint64_t{64} << 20;
// Per file, items in flight (queued, being compressed, or waiting to be appended) may add
// up to this many uncompressed bytes, or 4 items per thread, whichever is less; enough to
// keep every thread busy while the file thread appends. 256 MiB.
constexpr std::uint64_t kAheadBytes = std::uint64_t{256} << 20;
constexpr std::size_t kAheadItemsPerThread = 4;

// Uncompressed size of an item, as far as known before writing it: tensor bytes, the
// serialized blob, or 0 for an object (pickled objects are small).
std::uint64_t item_bytes(const save_steps::ItemToWrite& entry) {
  if (entry.value == nullptr) return entry.serialized.size();
  return entry.item->type == WriteItemType::kTensor ? entry.item->nbytes : 0;
}

// Holds a frame in memory; reserve() spares the regrowth copies of a multi-MiB frame.
class FrameSink final : public ByteSink {
 public:
  void write(ByteSpan data) override { out_.append(reinterpret_cast<const char*>(data.data()), data.size()); }
  using ByteSink::write;
  std::uint64_t position() const override { return out_.size(); }
  void reserve(std::size_t n) { out_.reserve(n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// One item compressed into memory, or the error compressing it threw.
struct Compressed {
  WrittenItem item;  // info.offset relative to `frame`
  std::string frame;
  std::exception_ptr error;
};

}  // namespace

CompressionPool::CompressionPool(int threads) {
  workers_.reserve(static_cast<std::size_t>(std::max(threads, 1)));
  for (int t = 0; t < std::max(threads, 1); ++t) workers_.emplace_back([this] { run(); });
}

CompressionPool::~CompressionPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  workers_.clear();  // joins, after the queue ran dry
}

void CompressionPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

void CompressionPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

int compression_thread_count(const SaveOptions& options) {
  if (options.compression_threads > 0) return options.compression_threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void write_compressed_ahead(storage::StorageWriter& writer, const save_steps::FileToWrite& file,
                            const ItemWriteOptions& options, CompressionPool& pool, const ItemWriteFn& write_one,
                            std::vector<WrittenItem>& out, const std::function<void()>& appended) {
  const std::size_t max_items = kAheadItemsPerThread * static_cast<std::size_t>(pool.threads());
  ItemWriteOptions streamed = options;
  streamed.zstd_workers = pool.threads() > 1 ? pool.threads() : 0;
  ItemWriteOptions in_memory = options;
  in_memory.zstd_workers = 0;

  // Items queued or compressed, in file order; `submitted` counts the items handed out.
  struct Pending {
    const save_steps::ItemToWrite* entry;
    std::uint64_t bytes;
    std::shared_ptr<Compressed> result;
    std::future<void> done;
  };
  std::deque<Pending> pending;
  std::uint64_t pending_bytes = 0;
  std::size_t submitted = 0;
  const std::vector<save_steps::ItemToWrite>& items = file.items;

  auto with_context = [&](const save_steps::ItemToWrite& entry, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const StorageError&) {
      rethrow_with_context("save: " + file.name + ": item \"" + entry.item->index.fqn + "\"");
    }
  };
  // Waits for the oldest pending item and appends its frame to the file.
  auto append_oldest = [&] {
    Pending p = std::move(pending.front());
    pending.pop_front();
    pending_bytes -= p.bytes;
    p.done.wait();
    if (p.result->error) std::rethrow_exception(p.result->error);
    WrittenItem item = std::move(p.result->item);
    item.info.offset = writer.position();
    with_context(*p.entry, [&] { writer.write(as_bytes(p.result->frame)); });
    out.push_back(std::move(item));
    appended();
  };
  // On an error, the queued tasks still reference `file`: wait for them before leaving.
  struct Drain {
    std::deque<Pending>& pending;
    ~Drain() {
      for (Pending& p : pending) p.done.wait();
    }
  } drain{pending};

  while (submitted < items.size() || !pending.empty()) {
    const bool more = submitted < items.size();
    const std::uint64_t bytes = more ? item_bytes(items[submitted]) : 0;
    if (more && bytes > kWholeItemBytes) {
      if (!pending.empty()) {
        append_oldest();
        continue;
      }
      const save_steps::ItemToWrite& entry = items[submitted++];
      with_context(entry, [&] { out.push_back(write_one(entry, writer, streamed)); });
      appended();
      continue;
    }
    const bool room = pending.empty() || (pending.size() < max_items && pending_bytes + bytes <= kAheadBytes);
    if (more && room) {
      const save_steps::ItemToWrite* entry = &items[submitted++];
      auto result = std::make_shared<Compressed>();
      auto task = std::make_shared<std::packaged_task<void()>>([entry, result, &write_one, &in_memory, bytes] {
        try {
          FrameSink sink;
          sink.reserve(bytes + (bytes >> 4) + 4096);
          result->item = write_one(*entry, sink, in_memory);
          result->frame = sink.take();
        } catch (...) {
          result->error = std::current_exception();
        }
      });
      pending.push_back({entry, bytes, result, task->get_future()});
      pending_bytes += bytes;
      pool.submit([task] { (*task)(); });
      continue;
    }
    append_oldest();
  }
}

}  // namespace shardpoint::engine
