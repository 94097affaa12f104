// Compressing a file's items on a pool of threads ahead of the thread that appends them to
// the file (SaveOptions::compression_threads): each item becomes one zstd frame in memory,
// byte for byte what the streaming path (item_writer.h) writes, and is appended in file
// order. Items too large to hold whole stream to the file instead, compressed by libzstd's
// own workers (one frame, which any zstd reader reads).
//
// Memory: per file, at most kAheadBytes (in the .cc) of items compressed or being
// compressed, plus one zstd context per pool thread.
//
// Thread-safety: a CompressionPool may be shared by several files' threads;
// write_compressed_ahead() runs on one file's thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/item_writer.h"
#include "engine/save_steps.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

// Threads that run tasks in the order they were submitted. Destroying the pool runs the
// tasks still queued, then joins.
class CompressionPool {
 public:
  // REQUIRES threads >= 1.
  explicit CompressionPool(int threads);
  ~CompressionPool();
  CompressionPool(const CompressionPool&) = delete;
  CompressionPool& operator=(const CompressionPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }
  // Queues `task`; it must not throw (capture errors in what it fills).
  void submit(std::function<void()> task);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::jthread> workers_;
};

// The threads SaveOptions::compression_threads asks for: itself when > 0, else one per
// hardware thread (at least 1).
int compression_thread_count(const SaveOptions& options);

// Writes one item of a file to `sink` with `options` (write_item() and its kin).
using ItemWriteFn =
    std::function<WrittenItem(const save_steps::ItemToWrite&, ByteSink& sink, const ItemWriteOptions& options)>;

// Writes `file`'s items to `writer` in file order through `write_one`, each compressed on
// `pool` into memory first (options.compression must be kZstd; the frames are what
// write_one writes straight to the file), appending the results to `out`. An item larger
// than kWholeItemBytes (in the .cc) is written straight to the file, once the items before
// it are appended, with libzstd's workers (pool.threads()) compressing it. `appended` runs
// after each item reached the file. Throws what write_one throws; StorageError from the
// writer, with the file and item named; items not yet appended are discarded.
void write_compressed_ahead(storage::StorageWriter& writer, const save_steps::FileToWrite& file,
                            const ItemWriteOptions& options, CompressionPool& pool, const ItemWriteFn& write_one,
                            std::vector<WrittenItem>& out, const std::function<void()>& appended);

}  // namespace shardpoint::engine
