#include "engine/slab_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <thread>

#include "engine/chunking.h"
#include "shardpoint/mutex.h"

namespace shardpoint::engine {
namespace {

// Cuts the tensors into batches of pieces that each fit one buffer, in output order, one
// box at a time (memory stays independent of the tensors' sizes).
class BatchPlanner {
 public:
  BatchPlanner(const std::vector<SlabTensor>& tensors, std::size_t buffer_bytes)
      : tensors_(tensors), buffer_bytes_(buffer_bytes) {}
  bool exhausted() const { return k_ >= tensors_.size(); }

  // The next batch. REQUIRES !exhausted(); the batch is not empty.
  std::vector<SlabPiece> next() {
    std::vector<SlabPiece> batch;
    std::size_t used = 0;
    while (k_ < tensors_.size()) {
      if (!head_) start_tensor();
      SlabPiece p = *head_;
      std::size_t padded = (used + kSlabPage - 1) / kSlabPage * kSlabPage;
      if (!batch.empty() && padded + p.n > buffer_bytes_) break;
      p.k = k_;
      p.buffer_offset = padded;
      used = padded + static_cast<std::size_t>(p.n);
      SlabPiece following;
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
  // The first piece of tensor k_; a tensor without elements is one empty piece (its record
  // is still written).
  void start_tensor() {
    const SlabTensor& t = tensors_[k_];
    at_ = 0;
    cursor_.reset();
    if (t.boxed) cursor_.emplace(t.shape, t.itemsize, buffer_bytes_);
    SlabPiece p;
    if (!pull(p)) p = SlabPiece{};
    p.first = true;
    head_ = std::move(p);
  }

  // The next piece of tensor k_: a box, or a byte range.
  bool pull(SlabPiece& p) {
    const SlabTensor& t = tensors_[k_];
    p = SlabPiece{};
    p.at = at_;
    if (cursor_) {
      if (!cursor_->next(p.offsets, p.sizes, p.n)) return false;
    } else {
      if (at_ >= t.nbytes()) return false;
      p.n = std::min<std::uint64_t>(buffer_bytes_, t.nbytes() - at_);
    }
    at_ += p.n;
    return true;
  }

  const std::vector<SlabTensor>& tensors_;
  const std::size_t buffer_bytes_;
  std::size_t k_ = 0;
  std::optional<SlabPiece> head_;  // the next piece of tensor k_, not yet in a batch
  std::optional<BoxCursor> cursor_;
  std::uint64_t at_ = 0;
};

}  // namespace

std::uint64_t SlabTensor::nbytes() const {
  std::uint64_t n = itemsize;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

void SlabPipeline::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

SlabPipeline::SlabPipeline(const SlabPipelineOptions& options) : options_(options) {
  slab_.reset(static_cast<std::byte*>(std::aligned_alloc(kSlabPage, options_.buffers * options_.buffer_bytes)));
  if (!slab_) throw std::bad_alloc();
}

SlabPipeline::~SlabPipeline() = default;

void SlabPipeline::run(const std::vector<SlabTensor>& tensors, const SlabCallbacks& callbacks) {
  struct Filled {
    std::size_t buf;
    std::vector<SlabPiece> pieces;
  };
  // What the readers and this thread share.
  struct Shared {
    Mutex mu;
    CondVar changed;                                        // notified on every change below
    std::map<std::size_t, Filled> ready SP_GUARDED_BY(mu);  // by batch number
    std::vector<std::size_t> free_bufs SP_GUARDED_BY(mu);
    std::size_t claimed SP_GUARDED_BY(mu) = 0;    // batches handed to readers
    std::size_t announced SP_GUARDED_BY(mu) = 0;  // tensors announced
    bool stop SP_GUARDED_BY(mu) = false;
    std::exception_ptr error SP_GUARDED_BY(mu);
  } sh;
  BatchPlanner planner(tensors, options_.buffer_bytes);  // used under sh.mu
  {
    MutexLock lock(sh.mu);
    for (std::size_t b = 0; b < options_.buffers; ++b) sh.free_bufs.push_back(b);
  }
  auto buffer = [&](std::size_t b) { return slab_.get() + b * options_.buffer_bytes; };

  auto produce = [&] {
    try {
      while (true) {
        std::size_t buf = 0, batch = 0;
        std::vector<SlabPiece> pieces;
        std::size_t announce_from = 0, announce_to = 0;
        {
          MutexLock lock(sh.mu);
          sh.changed.wait(sh.mu,
                          [&]() SP_REQUIRES(sh.mu) { return sh.stop || planner.exhausted() || !sh.free_bufs.empty(); });
          if (sh.stop || planner.exhausted()) return;
          buf = sh.free_bufs.back();
          sh.free_bufs.pop_back();
          batch = sh.claimed++;
          pieces = planner.next();
          announce_from = sh.announced;
          sh.announced = std::max(sh.announced, std::min(tensors.size(), pieces.back().k + options_.read_ahead));
          announce_to = sh.announced;
        }
        if (callbacks.announce && announce_from < announce_to) callbacks.announce(announce_from, announce_to);
        for (const SlabPiece& p : pieces) {
          if (p.n == 0) continue;
          callbacks.read(p, std::span<std::byte>(buffer(buf) + p.buffer_offset, static_cast<std::size_t>(p.n)));
        }
        MutexLock lock(sh.mu);
        sh.ready.emplace(batch, Filled{buf, std::move(pieces)});
        sh.changed.notify_all();
      }
    } catch (...) {
      MutexLock lock(sh.mu);
      if (!sh.error) sh.error = std::current_exception();
      sh.stop = true;
      sh.changed.notify_all();
    }
  };

  std::vector<std::thread> readers;
  auto finish = [&] {
    {
      MutexLock lock(sh.mu);
      sh.stop = true;
      sh.changed.notify_all();
    }
    for (auto& t : readers) t.join();
  };
  try {
    for (std::size_t i = 0; i < options_.readers; ++i) readers.emplace_back(produce);
    for (std::size_t batch = 0;; ++batch) {
      Filled f;
      {
        MutexLock lock(sh.mu);
        sh.changed.wait(sh.mu, [&]() SP_REQUIRES(sh.mu) {
          return sh.ready.count(batch) || sh.error || (planner.exhausted() && batch >= sh.claimed);
        });
        if (sh.error) std::rethrow_exception(sh.error);
        auto it = sh.ready.find(batch);
        if (it == sh.ready.end()) break;  // every batch written
        f = std::move(it->second);
        sh.ready.erase(it);
      }
      for (const SlabPiece& p : f.pieces) {
        if (p.first && callbacks.begin) callbacks.begin(p.k);
        if (p.n > 0) {
          callbacks.write(std::span<const std::byte>(buffer(f.buf) + p.buffer_offset, static_cast<std::size_t>(p.n)));
        }
        if (p.last && callbacks.end) callbacks.end(p.k);
      }
      {
        MutexLock lock(sh.mu);
        sh.free_bufs.push_back(f.buf);
        sh.changed.notify_all();
      }
      if (callbacks.after_buffer) callbacks.after_buffer();
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

}  // namespace shardpoint::engine
