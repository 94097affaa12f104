#include "core/buffer_pool.h"

#include <sys/mman.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "shardpoint/error.h"

namespace shardpoint {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t align) { return (n + align - 1) / align * align; }

std::string describe(std::size_t count, std::size_t bytes) {
  return std::to_string(count) + " buffers of " + std::to_string(bytes) + " bytes, all leased";
}

}  // namespace

BufferPool::Lease::Lease(Lease&& other) noexcept : pool_(other.pool_), data_(other.data_), size_(other.size_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
  other.size_ = 0;
}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = other.pool_;
    data_ = other.data_;
    size_ = other.size_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void BufferPool::Lease::release() noexcept {
  if (pool_ != nullptr && data_ != nullptr) pool_->give_back(data_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

static std::size_t checked_alignment(const BufferPoolOptions& o) {
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) != 0) {
    throw UsageError("buffer pool: alignment " + std::to_string(o.alignment) + " is not a power of two");
  }
  if (o.buffer_bytes == 0) throw UsageError("buffer pool: buffer_bytes must be > 0");
  return o.alignment;
}

BufferPool::BufferPool(const BufferPoolOptions& options)
    : buffer_bytes_(round_up(options.buffer_bytes, checked_alignment(options))),
      alignment_(options.alignment),
      max_buffers_(std::max<std::size_t>(1, options.capacity_bytes / buffer_bytes_)),
      huge_pages_(options.huge_pages) {}

BufferPool::~BufferPool() {
  MutexLock lock(mu_);
  assert(free_.size() == all_.size() && "BufferPool destroyed with leases outstanding");
  for (std::byte* p : all_) std::free(p);
}

std::byte* BufferPool::take_locked() {
  if (!free_.empty()) {
    std::byte* p = free_.back();
    free_.pop_back();
    return p;
  }
  if (all_.size() >= max_buffers_) return nullptr;
  return allocate_locked();
}

std::byte* BufferPool::allocate_locked() {
  // Large buffers get 2 MiB alignment so transparent huge pages can back them whole.
  bool huge = huge_pages_ && buffer_bytes_ >= kHugePage;
  std::size_t align = huge ? std::max(alignment_, kHugePage) : alignment_;
  all_.reserve(max_buffers_);
  free_.reserve(max_buffers_);
  void* p = nullptr;
  if (::posix_memalign(&p, align, buffer_bytes_) != 0) throw std::bad_alloc();
  // Advisory only: a kernel without THP refuses and we run on 4 KiB pages.
  if (huge) (void)::madvise(p, buffer_bytes_, MADV_HUGEPAGE);
  all_.push_back(static_cast<std::byte*>(p));
  return static_cast<std::byte*>(p);
}

void BufferPool::give_back(std::byte* data) noexcept {
  {
    MutexLock lock(mu_);
    free_.push_back(data);  // capacity reserved in take_locked: cannot throw
  }
  returned_.notify_one();
}

BufferPool::Lease BufferPool::acquire(Clock::time_point deadline, std::stop_token stop) {
  auto start = Clock::now();
  MutexLock lock(mu_);
  std::byte* p = nullptr;
  auto ready = [&]() SP_REQUIRES(mu_) { return (p = take_locked()) != nullptr; };
  if (deadline == Clock::time_point::max()) {
    returned_.wait(mu_, stop, ready);
  } else {
    returned_.wait_until(mu_, stop, deadline, ready);
  }
  if (p == nullptr) {
    if (stop.stop_requested()) {
      throw StorageError(StorageError::Kind::kOther, "buffer pool: cancelled while waiting for a buffer (" +
                                                         describe(max_buffers_, buffer_bytes_) + ")");
    }
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    throw StorageError(StorageError::Kind::kTransient, "buffer pool: no buffer free after " + std::to_string(waited) +
                                                           " ms (" + describe(max_buffers_, buffer_bytes_) + ")");
  }
  return Lease(this, p, buffer_bytes_);
}

std::optional<BufferPool::Lease> BufferPool::try_acquire() {
  MutexLock lock(mu_);
  std::byte* p = take_locked();
  if (p == nullptr) return std::nullopt;
  return Lease(this, p, buffer_bytes_);
}

std::size_t BufferPool::prefault(std::size_t count) {
  // New buffers stay out of free_ until touched, so no lease sees them half-written.
  std::vector<std::byte*> fresh;
  {
    MutexLock lock(mu_);
    while (all_.size() < std::min(count, max_buffers_)) fresh.push_back(allocate_locked());
  }
  for (std::byte* p : fresh) std::memset(p, 0, buffer_bytes_);
  {
    MutexLock lock(mu_);
    free_.insert(free_.end(), fresh.begin(), fresh.end());
  }
  returned_.notify_all();
  return allocated_buffers();
}

std::size_t BufferPool::allocated_buffers() const {
  MutexLock lock(mu_);
  return all_.size();
}

std::size_t BufferPool::leased_buffers() const {
  MutexLock lock(mu_);
  return all_.size() - free_.size();
}

}  // namespace shardpoint
