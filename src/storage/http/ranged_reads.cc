#include "storage/http/ranged_reads.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

namespace shardpoint::storage::http {
namespace {

// Adds [begin, end) to a set of disjoint ranges (start -> end), merging what touches it.
void add_range(std::map<std::uint64_t, std::uint64_t>& set, std::uint64_t begin, std::uint64_t end) {
  if (begin >= end) return;
  auto it = set.upper_bound(begin);
  if (it != set.begin() && std::prev(it)->second >= begin) {
    --it;
    begin = it->first;
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  while (it != set.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set.emplace(begin, end);
}

// Removes [begin, end) from a set of disjoint ranges; returns the ranges it removed.
std::vector<std::pair<std::uint64_t, std::uint64_t>> remove_range(std::map<std::uint64_t, std::uint64_t>& set,
                                                                  std::uint64_t begin, std::uint64_t end) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> removed;
  auto it = set.upper_bound(begin);
  if (it != set.begin() && std::prev(it)->second > begin) --it;
  while (it != set.end() && it->first < end) {
    const auto [r_begin, r_end] = *it;
    it = set.erase(it);
    removed.emplace_back(std::max(r_begin, begin), std::min(r_end, end));
    if (r_begin < begin) set.emplace(r_begin, begin);
    if (end < r_end) {
      set.emplace(end, r_end);
      break;
    }
  }
  return removed;
}

}  // namespace

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

bool ReadAheadBudget::try_charge(std::uint64_t bytes) {
  std::uint64_t now = used_.load();
  do {
    if (now + bytes > capacity_) return false;
  } while (!used_.compare_exchange_weak(now, now + bytes));
  note_used(now + bytes);
  return true;
}

void ReadAheadBudget::charge(std::uint64_t bytes) { note_used(used_.fetch_add(bytes) + bytes); }

void ReadAheadBudget::note_used(std::uint64_t used) {
  for (std::uint64_t seen = peak_.load(); used > seen && !peak_.compare_exchange_weak(seen, used);) {
  }
}

void ReadAheadBudget::release(std::uint64_t bytes) { used_.fetch_sub(bytes); }

void ReadAheadBudget::add_source(const WindowedSource* source) {
  MutexLock lock(mu_);
  sources_.push_back(source);
}

void ReadAheadBudget::remove_source(const WindowedSource* source) {
  MutexLock lock(mu_);
  std::erase(sources_, source);
}

void ReadAheadBudget::reclaim(const WindowedSource* asking, std::uint64_t bytes, bool unread_too) {
  // mu_ keeps every source in sources_ alive while it sheds (their destructors wait in
  // remove_source()). shed() only tries the source's lock: a source holding its own lock
  // while it waits here for mu_ is skipped, not waited for.
  MutexLock lock(mu_);
  for (const WindowedSource* source : sources_) {
    const std::uint64_t now = used_.load();
    if (now + bytes <= capacity_) return;
    if (source != asking) source->shed(now + bytes - capacity_, unread_too);
  }
}

std::uint64_t WindowedSource::cache_bytes(std::size_t window_bytes, int windows) {
  return static_cast<std::uint64_t>(std::max(1, windows)) * std::max(window_bytes, kMinWindowBytes);
}

WindowedSource::WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows,
                               RangeFetch fetch, int ahead, std::shared_ptr<ReadAheadBudget> budget)
    : name_(std::move(name)),
      size_(size),
      window_bytes_(std::max(window_bytes, kMinWindowBytes)),
      windows_(std::max(1, windows)),
      ahead_(std::clamp(ahead, 0, windows_ - 1)),
      fetch_(std::move(fetch)),
      budget_(std::move(budget)) {
  if (budget_) budget_->add_source(this);
}

WindowedSource::~WindowedSource() {
  // First: from here on no other source's reclaim() drops blocks of this one.
  if (budget_) budget_->remove_source(this);
  std::vector<std::jthread> threads;
  {
    MutexLock lock(mu_);
    closing_ = true;  // the fetches still running queue no more
    jobs_.clear();    // not started: their blocks' futures break, and no reader waits on them
    threads.swap(threads_);
  }
  for (std::jthread& t : threads) t.request_stop();
  // Joined here, while the members their running fetches finish with are alive.
  threads.clear();
  if (budget_) budget_->release(cached_bytes_);  // no thread left that could change it
}

void WindowedSource::read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
  check_range(offset, out.size(), what);
  std::size_t done = 0;
  while (done < out.size()) {
    const std::uint64_t pos = offset + done;
    const std::size_t left = out.size() - done;
    if (left >= window_bytes_) {
      MutexLock lock(mu_);
      if (find_block(pos) == cache_.end()) {
        // Straight into the caller's buffer, up to the next block that holds (or is fetching)
        // some of it.
        std::uint64_t end = pos + left;
        for (const Block& b : cache_) {
          if (pos < b.start && b.start < end) end = b.start;
        }
        forget_hints(pos, end);  // read now: no later block looks back over it
        lock.unlock();
        const std::size_t n = static_cast<std::size_t>(end - pos);
        fetch_(pos, out.subspan(done, n));
        done += n;
        continue;
      }
    }
    const Piece block = block_for(pos, left);
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, block.start + block.length - pos));
    std::memcpy(out.data() + done, block.bytes.get() + (pos - block.start), n);
    done += n;
  }
}

void WindowedSource::will_need(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0 || offset >= size_) return;
  const std::uint64_t end = offset + std::min(length, size_ - offset);
  MutexLock lock(mu_);
  // Bytes a block holds already are that block's to be read (unless a reader took them
  // before they were announced); the rest are announced for later blocks.
  Ranges held;
  for (Block& b : cache_) {
    const std::uint64_t begin = std::max(offset, b.start);
    const std::uint64_t stop = std::min(end, b.start + b.length);
    if (begin >= stop) continue;
    std::uint64_t at = begin;  // the parts of [begin, stop) no read took yet
    auto r = b.read.upper_bound(begin);
    if (r != b.read.begin()) --r;
    for (; r != b.read.end() && r->first < stop; ++r) {
      if (r->second <= at) continue;
      if (at < r->first) add_range(b.unread, at, r->first);
      at = std::max(at, r->second);
    }
    if (at < stop) add_range(b.unread, at, stop);
    held.emplace_back(begin, stop);
  }
  std::sort(held.begin(), held.end());
  std::uint64_t at = offset;
  for (const auto& [begin, stop] : held) {
    if (at < begin) announce(at, begin);
    at = std::max(at, stop);
  }
  if (at < end) announce(at, end);
}

void WindowedSource::Block::take(std::uint64_t offset, std::uint64_t n) {
  remove_range(unread, offset, offset + n);
  add_range(read, offset, offset + n);
}

void WindowedSource::adopt_first_block(std::shared_ptr<const std::byte[]> bytes, std::uint64_t length) {
  if (length == 0 || length > size_ || !bytes) return;
  MutexLock lock(mu_);
  if (!make_room(length, /*for_miss=*/false)) return;
  if (budget_ && !budget_->try_charge(length)) return;
  std::promise<Bytes> ready;
  ready.set_value(std::move(bytes));
  Block block;
  block.start = 0;
  block.length = length;
  block.id = next_id_++;
  block.fetching = false;
  block.bytes = ready.get_future().share();
  cache_.push_front(std::move(block));
  cached_bytes_ += length;
}

std::uint64_t WindowedSource::cached_bytes() const {
  MutexLock lock(mu_);
  return cached_bytes_;
}

void WindowedSource::announce(std::uint64_t begin, std::uint64_t end) const {
  add_range(hints_, begin, end);
  if (hints_.size() > kMaxHints) hints_.erase(hints_.begin());
}

WindowedSource::Ranges WindowedSource::forget_hints(std::uint64_t begin, std::uint64_t end) const {
  return remove_range(hints_, begin, end);
}

std::list<WindowedSource::Block>::iterator WindowedSource::find_block(std::uint64_t offset) const {
  return std::find_if(cache_.begin(), cache_.end(),
                      [&](const Block& b) { return b.start <= offset && offset < b.start + b.length; });
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

bool WindowedSource::make_room(std::uint64_t length, bool for_miss) const {
  const std::uint64_t own_budget = cache_bytes(window_bytes_, windows_);
  const auto fits_shared = [&] { return !budget_ || budget_->used() + length <= budget_->capacity(); };
  const auto fits = [&]() SP_REQUIRES(mu_) {
    return cached_bytes_ + length <= own_budget && cache_.size() + 1 <= kMaxBlocks && fits_shared();
  };
  if (!for_miss) {
    // All or nothing for this source's budget: a fetch ahead that cannot fit drops nothing.
    // (What the shared budget can give shows only by dropping: see ReadAheadBudget.)
    std::uint64_t bytes = cached_bytes_;
    std::size_t blocks = cache_.size();
    for (const Block& b : cache_) {
      if (!b.fetching && b.unread.empty()) {
        bytes -= b.length;
        --blocks;
      }
    }
    if (bytes + length > own_budget || blocks + 1 > kMaxBlocks) return false;
  }
  // Blocks read through, least recently used first: this source's, then the other sources'.
  drop_read_through([&]() SP_REQUIRES(mu_) { return fits(); });
  if (!fits_shared()) budget_->reclaim(this, length, /*unread_too=*/false);
  if (for_miss) {
    // A miss then drops blocks still to be read, furthest first: readers move forward, so
    // those are read last (and fetched again then). This source's, then the others'.
    while (!fits() && drop_furthest()) {
    }
    if (!fits_shared()) budget_->reclaim(this, length, /*unread_too=*/true);
  }
  return fits();
}

std::list<WindowedSource::Block>::iterator WindowedSource::drop(std::list<Block>::iterator it) const {
  cached_bytes_ -= it->length;
  if (budget_) budget_->release(it->length);
  return cache_.erase(it);
}

template <typename Done>
void WindowedSource::drop_read_through(const Done& done) const {
  for (auto it = cache_.end(); it != cache_.begin() && !done();) {
    --it;
    if (!it->fetching && it->unread.empty()) it = drop(it);
  }
}

bool WindowedSource::drop_furthest() const {
  auto furthest = cache_.end();
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (!it->fetching && (furthest == cache_.end() || it->start > furthest->start)) furthest = it;
  }
  if (furthest == cache_.end()) return false;
  drop(furthest);
  return true;
}

void WindowedSource::shed(std::uint64_t bytes, bool unread_too) const noexcept {
  if (!mu_.try_lock()) return;
  MutexLock lock(mu_, std::adopt_lock);
  const std::uint64_t target = cached_bytes_ - std::min(cached_bytes_, bytes);
  drop_read_through([&]() SP_REQUIRES(mu_) { return cached_bytes_ <= target; });
  while (unread_too && cached_bytes_ > target && drop_furthest()) {
  }
}

void WindowedSource::fetch_ahead() const noexcept {
  std::uint64_t charged = 0;  // charged to the budget for a block not cached yet
  try {
    std::uint64_t pos = 0;
    while (ahead_jobs_ < ahead_ && !ahead_paused_ && !closing_) {
      // The first announced byte at or after pos: readers read in file order, so the
      // lowest announced bytes no block holds are the next ones missed.
      auto hint = hints_.upper_bound(pos);
      if (hint != hints_.begin() && std::prev(hint)->second > pos) --hint;
      if (hint == hints_.end()) return;
      const std::uint64_t at = std::max(pos, hint->first);
      if (auto cached = find_block(at); cached != cache_.end()) {
        // Announced after its block was fetched: the bytes are here already.
        pos = cached->start + cached->length;
        forget_hints(at, pos);
        continue;
      }
      const auto [begin, end] = block_range(at, 1);
      if (!make_room(end - begin, /*for_miss=*/false)) return;
      if (idle_threads_ == 0 && threads_.size() < static_cast<std::size_t>(ahead_)) {
        try {
          threads_.emplace_back(
              [this](const std::stop_token& stop) { run_jobs(stop); });  // takes the job when it starts
        } catch (const std::system_error&) {
          // Out of threads: the ones running take the job, or the readers fetch its bytes.
          if (threads_.empty()) return;
        }
      }
      if (budget_) {
        if (!budget_->try_charge(end - begin)) return;  // another source took the room meanwhile
        charged = end - begin;
      }
      Job job;
      job.id = next_id_++;
      job.start = begin;
      job.length = end - begin;
      job.announced = forget_hints(begin, end);
      Block block;
      block.start = begin;
      block.length = end - begin;
      block.id = job.id;
      block.fetched_ahead = true;
      for (const auto& [b, e] : job.announced) add_range(block.unread, b, e);
      block.bytes = job.promise.get_future().share();
      // Queued before it is cached: a block in the cache is always being fetched or fetched.
      jobs_.push_back(std::move(job));
      ++ahead_jobs_;
      cache_.push_front(std::move(block));
      cached_bytes_ += end - begin;
      charged = 0;
      job_queued_.notify_one();
      pos = end;
    }
  } catch (const std::bad_alloc&) {
    // Fetching ahead is an optimization: what it did not queue, readers fetch themselves
    // (the state above is consistent after every step).
    if (charged > 0) budget_->release(charged);
  }
}

void WindowedSource::run_jobs(const std::stop_token& stop) const {
  MutexLock lock(mu_);
  for (;;) {
    ++idle_threads_;
    job_queued_.wait(mu_, stop, [&]() SP_REQUIRES(mu_) { return !jobs_.empty(); });
    --idle_threads_;
    if (stop.stop_requested()) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fill(job.id, job.start, job.length, /*fetched_ahead=*/true, job.announced, job.promise);
    lock.lock();
  }
}

void WindowedSource::fill(std::uint64_t id, std::uint64_t start, std::uint64_t length, bool fetched_ahead,
                          const Ranges& announced, std::promise<Bytes>& promise) const {
  try {
    // Not zero-filled: the fetch writes every byte or throws.
    std::shared_ptr<std::byte[]> bytes = std::make_unique_for_overwrite<std::byte[]>(length);
    fetch_(start, std::span(bytes.get(), length));
    {
      MutexLock lock(mu_);
      for (Block& b : cache_) {
        if (b.id == id) b.fetching = false;
      }
      if (fetched_ahead) {
        --ahead_jobs_;
      } else {
        if (id >= ahead_paused_until_) ahead_paused_ = false;  // the object reads again
      }
      fetch_ahead();
    }
    promise.set_value(std::move(bytes));
  } catch (...) {
    {
      // Out of the cache before a waiting reader sees the error, so its retry fetches again.
      MutexLock lock(mu_);
      const auto failed = std::find_if(cache_.begin(), cache_.end(), [&](const Block& b) { return b.id == id; });
      if (failed != cache_.end()) drop(failed);
      for (const auto& [begin, end] : announced) announce(begin, end);
      if (fetched_ahead) {
        --ahead_jobs_;
        // No retries in the background: paused until the fetch of a miss that starts after
        // this failure succeeds.
        ahead_paused_ = true;
        ahead_paused_until_ = next_id_;
      }
    }
    promise.set_exception(std::current_exception());
  }
}

WindowedSource::Piece WindowedSource::block_for(std::uint64_t offset, std::uint64_t length) const {
  bool retried = false;
  for (;;) {
    MutexLock lock(mu_);
    auto it = find_block(offset);
    if (it != cache_.end()) {
      cache_.splice(cache_.begin(), cache_, it);
      Block& hit = cache_.front();
      hit.take(offset, std::min(length, hit.start + hit.length - offset));
      const std::shared_future<Bytes> bytes = hit.bytes;
      const std::uint64_t start = hit.start;
      const std::uint64_t block_length = hit.length;
      const bool fetched_ahead = hit.fetched_ahead;
      fetch_ahead();
      lock.unlock();
      try {
        return {bytes.get(), start, block_length};  // waits while it is being fetched
      } catch (...) {
        // A failed fetch ahead was not this reader's request: it fetches the bytes itself
        // once (the failed block is out of the cache) before an error is the reader's.
        if (!fetched_ahead || retried) throw;
        retried = true;
        continue;
      }
    }
    std::promise<Bytes> promise;
    Block mine;
    const auto [begin, end] = block_range(offset, length);
    const Ranges announced = forget_hints(begin, end);
    mine.start = begin;
    mine.length = end - begin;
    const std::uint64_t id = mine.id = next_id_++;
    for (const auto& [b, e] : announced) add_range(mine.unread, b, e);
    mine.take(offset, std::min(length, end - offset));
    mine.bytes = promise.get_future().share();
    const std::shared_future<Bytes> bytes = mine.bytes;
    make_room(mine.length, /*for_miss=*/true);  // fetched even when nothing can be dropped
    cache_.push_front(std::move(mine));
    cached_bytes_ += end - begin;
    if (budget_) budget_->charge(end - begin);
    fetch_ahead();
    lock.unlock();
    fill(id, begin, end - begin, /*fetched_ahead=*/false, announced, promise);
    return {bytes.get(), begin, end - begin};
  }
}

}  // namespace shardpoint::storage::http
