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
  std::size_t done = 0;
  while (done < out.size()) {
    const std::uint64_t pos = offset + done;
    const std::size_t left = out.size() - done;
    if (left >= window_bytes_) {
      std::unique_lock lock(mu_);
      const bool cached = std::any_of(cache_.begin(), cache_.end(),
                                      [&](const Block& b) { return b.start <= pos && pos < b.start + b.length; });
      if (!cached) forget_hints(pos, offset + out.size());  // read now: no later block looks back over it
      lock.unlock();
      if (!cached) {
        fetch_(pos, out.subspan(done));
        return;
      }
    }
    std::uint64_t start = 0;
    Bytes block = block_for(pos, left, &start);
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, start + block->size() - pos));
    std::memcpy(out.data() + done, block->data() + (pos - start), n);
    done += n;
  }
}

void WindowedSource::will_need(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0 || offset >= size_) return;
  std::uint64_t begin = offset;
  std::uint64_t end = offset + std::min(length, size_ - offset);
  std::lock_guard lock(mu_);
  auto it = hints_.upper_bound(begin);
  if (it != hints_.begin() && std::prev(it)->second >= begin) {
    --it;
    begin = it->first;
    end = std::max(end, it->second);
    it = hints_.erase(it);
  }
  while (it != hints_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = hints_.erase(it);
  }
  hints_.emplace(begin, end);
  if (hints_.size() > kMaxHints) hints_.erase(hints_.begin());
}

void WindowedSource::forget_hints(std::uint64_t begin, std::uint64_t end) const {
  auto it = hints_.upper_bound(begin);
  if (it != hints_.begin() && std::prev(it)->second > begin) --it;
  while (it != hints_.end() && it->first < end) {
    const auto [h_begin, h_end] = *it;
    it = hints_.erase(it);
    if (h_begin < begin) hints_.emplace(h_begin, begin);
    if (end < h_end) {
      hints_.emplace(end, h_end);
      break;
    }
  }
}

std::pair<std::uint64_t, std::uint64_t> WindowedSource::block_range(std::uint64_t offset, std::uint64_t length) const {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  auto hint = hints_.upper_bound(offset);
  if (hint != hints_.begin() && std::prev(hint)->second >= offset + length) {
    // Announced: this range and the announced ones close after it, up to a window. The
    // block starts where the announced, unfetched bytes before the read start, at most
    // window / 4 back: a blob's records are read after its data, and reader threads take
    // blobs in file order, so the one ahead misses first while the one behind still reads
    // up to here; that one then finds its bytes cached instead of fetching the gap in a
    // small GET of its own.
    --hint;
    start = std::max(hint->first, offset - std::min<std::uint64_t>(offset, window_bytes_ / 4));
    end = hint->second;
    const std::uint64_t limit = std::min(size_, start + window_bytes_);
    const std::uint64_t gap = window_bytes_ / 8;
    for (++hint; hint != hints_.end() && hint->first < limit && hint->first - end <= gap; ++hint) end = hint->second;
    end = std::min(end, limit);
  } else {
    // Header-sized reads look behind (a zip's end records are read before its central
    // directory); data-sized ones are streamed forward and start the block where they start.
    const std::uint64_t lookbehind = std::min<std::uint64_t>(64 << 10, window_bytes_ / 4);
    start = length < lookbehind ? offset - std::min(offset, lookbehind) : offset;
    if (start + window_bytes_ > size_) start = size_ - std::min<std::uint64_t>(size_, window_bytes_);
    end = std::min<std::uint64_t>(size_, start + window_bytes_);
  }
  // Tile: no byte twice in the cache (offset itself is in no cached block).
  for (const Block& b : cache_) {
    const std::uint64_t b_end = b.start + b.length;
    if (b.start <= start && start < b_end) start = b_end;  // b_end <= offset
    if (offset < b.start && b.start < end) end = b.start;
  }
  return {start, end};
}

WindowedSource::Bytes WindowedSource::block_for(std::uint64_t offset, std::uint64_t length,
                                                std::uint64_t* start) const {
  std::promise<Bytes> promise;
  Block mine;
  {
    std::unique_lock lock(mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->start <= offset && offset < it->start + it->length) {
        cache_.splice(cache_.begin(), cache_, it);
        Block hit = cache_.front();
        lock.unlock();
        *start = hit.start;
        return hit.bytes.get();  // waits when another thread is fetching it; rethrows its error
      }
    }
    const auto [begin, end] = block_range(offset, length);
    forget_hints(begin, end);
    mine.start = begin;
    mine.length = end - begin;
    mine.id = next_id_++;
    mine.bytes = promise.get_future().share();
    cache_.push_front(mine);
    cached_bytes_ += mine.length;
    const std::uint64_t budget = static_cast<std::uint64_t>(windows_) * window_bytes_;
    while (cache_.size() > 1 && (cached_bytes_ > budget || cache_.size() > kMaxBlocks)) {
      cached_bytes_ -= cache_.back().length;
      cache_.pop_back();
    }
  }
  *start = mine.start;
  try {
    auto bytes = std::make_shared<std::string>(mine.length, '\0');
    fetch_(mine.start, std::as_writable_bytes(std::span(*bytes)));
    promise.set_value(std::move(bytes));
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mu_);  // a failed block is not cached: the next read tries again
    cache_.remove_if([&](const Block& b) {
      if (b.id != mine.id) return false;
      cached_bytes_ -= b.length;
      return true;
    });
  }
  return mine.bytes.get();
}

}  // namespace shardpoint::storage::http
