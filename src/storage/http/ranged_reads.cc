#include "storage/http/ranged_reads.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace shardpoint::storage::http {

void for_each_in_parallel(std::size_t count, int threads, const std::function<void(std::size_t)>& fn) {
  const int workers = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), count));
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < workers; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (std::size_t i = next++; i < count; i = next++) fn(i);
        } catch (...) {
          errors[static_cast<std::size_t>(t)] = std::current_exception();
          next = count;  // the others stop at their next index
        }
      });
    }
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void read_in_parallel(std::uint64_t offset, std::span<std::byte> out, std::size_t parallel_bytes,
                      std::size_t chunk_bytes, int threads, const RangeFetch& fetch) {
  if (out.size() < parallel_bytes || threads <= 1) {
    fetch(offset, out);
    return;
  }
  const std::size_t chunk = std::max<std::size_t>(chunk_bytes, std::size_t{1} << 20);
  const std::size_t chunks = (out.size() + chunk - 1) / chunk;
  for_each_in_parallel(chunks, threads, [&](std::size_t i) {
    std::size_t begin = i * chunk;
    fetch(offset + begin, out.subspan(begin, std::min(chunk, out.size() - begin)));
  });
}

WholeObjectSource::WholeObjectSource(std::string bytes, std::string name)
    : bytes_(std::move(bytes)), source_(as_bytes(bytes_), std::move(name)) {}

void WholeObjectSource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  source_.read(offset, out, what);
}

std::optional<ByteSpan> WholeObjectSource::view(std::uint64_t offset, std::uint64_t length,
                                                std::string_view what) const {
  return source_.view(offset, length, what);
}

WindowedSource::WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows,
                               RangeFetch fetch)
    : name_(std::move(name)), size_(size), window_bytes_(std::max<std::size_t>(window_bytes, 4096)),
      windows_(std::max(1, windows)), fetch_(std::move(fetch)) {}

void WindowedSource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  check_range(offset, out.size(), what);
  if (out.empty()) return;
  if (out.size() >= window_bytes_) {
    fetch_(offset, out);
    return;
  }
  std::uint64_t start = 0;
  Bytes block = block_for(offset, out.size(), &start);
  std::memcpy(out.data(), block->data() + (offset - start), out.size());
}

WindowedSource::Bytes WindowedSource::block_for(std::uint64_t offset, std::size_t length, std::uint64_t* start) const {
  std::promise<Bytes> promise;
  Block mine;
  {
    std::unique_lock lock(mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->start <= offset && offset + length <= it->start + it->length) {
        cache_.splice(cache_.begin(), cache_, it);
        Block hit = cache_.front();
        lock.unlock();
        *start = hit.start;
        return hit.bytes.get();  // waits when another thread is fetching it; rethrows its error
      }
    }
    // Header-sized reads look behind (a zip's end records are read before its central
    // directory); data-sized ones are streamed forward and start the block where they start.
    const std::uint64_t lookbehind = std::min<std::uint64_t>(64 << 10, window_bytes_ / 4);
    mine.start = length < lookbehind ? offset - std::min(offset, lookbehind) : offset;
    if (mine.start + window_bytes_ > size_) mine.start = size_ - std::min<std::uint64_t>(size_, window_bytes_);
    mine.length = std::min<std::uint64_t>(window_bytes_, size_ - mine.start);
    mine.id = next_id_++;
    mine.bytes = promise.get_future().share();
    cache_.push_front(mine);
    while (static_cast<int>(cache_.size()) > windows_) cache_.pop_back();
  }
  *start = mine.start;
  try {
    auto bytes = std::make_shared<std::string>(mine.length, '\0');
    fetch_(mine.start, std::as_writable_bytes(std::span(*bytes)));
    promise.set_value(std::move(bytes));
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mu_);  // a failed block is not cached: the next read tries again
    cache_.remove_if([&](const Block& b) { return b.id == mine.id; });
  }
  return mine.bytes.get();
}

}  // namespace shardpoint::storage::http
