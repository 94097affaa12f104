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
  std::uint64_t start = offset / window_bytes_ * window_bytes_;
  if (offset + out.size() > start + window_bytes_) start = offset;  // straddles: a window from offset
  std::uint64_t length = std::min<std::uint64_t>(window_bytes_, size_ - start);
  std::shared_ptr<const std::string> block = window(start, length);
  std::memcpy(out.data(), block->data() + (offset - start), out.size());
}

std::shared_ptr<const std::string> WindowedSource::window(std::uint64_t start, std::uint64_t length) const {
  {
    std::lock_guard lock(mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first == start && it->second->size() == length) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().second;
      }
    }
  }
  auto block = std::make_shared<std::string>(length, '\0');
  fetch_(start, std::as_writable_bytes(std::span(*block)));
  std::lock_guard lock(mu_);
  cache_.emplace_front(start, block);
  while (static_cast<int>(cache_.size()) > windows_) cache_.pop_back();
  return block;
}

}  // namespace shardpoint::storage::http
