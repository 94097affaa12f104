#include "core/buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "shardpoint/error.h"

namespace shardpoint {
namespace {

using namespace std::chrono_literals;

BufferPoolOptions small_pool(std::size_t buffer_bytes, std::size_t count) {
  BufferPoolOptions o;
  o.buffer_bytes = buffer_bytes;
  o.capacity_bytes = buffer_bytes * count;
  return o;
}

TEST(BufferPoolTest, BuffersAreAlignedAndRoundedToTheAlignment) {
  BufferPool pool(small_pool(5000, 3));
  EXPECT_EQ(pool.buffer_bytes(), 8192u);  // 5000 rounded up to 4096
  EXPECT_EQ(pool.max_buffers(), 1u);      // 15000 bytes of capacity hold one 8192-byte buffer
  auto lease = pool.acquire();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(lease.data()) % 4096, 0u);
  EXPECT_EQ(lease.size(), 8192u);
  lease.bytes()[8191] = std::byte{1};  // writable to the end

  BufferPool huge(small_pool(std::size_t{4} << 20, 1));
  auto big = huge.acquire();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % (std::size_t{2} << 20), 0u);
}

TEST(BufferPoolTest, BuffersAreReusedNotReallocated) {
  BufferPool pool(small_pool(1 << 20, 4));
  std::byte* first = nullptr;
  for (int i = 0; i < 100; ++i) {
    auto lease = pool.acquire();
    if (first == nullptr) first = lease.data();
    EXPECT_EQ(lease.data(), first);
  }
  EXPECT_EQ(pool.allocated_buffers(), 1u);  // lazily: only what was needed at once
  EXPECT_EQ(pool.leased_buffers(), 0u);
}

TEST(BufferPoolTest, AcquireBlocksUntilALeaseIsReturned) {
  BufferPool pool(small_pool(4096, 2));
  auto a = pool.acquire();
  auto b = pool.acquire();
  EXPECT_FALSE(pool.try_acquire().has_value());
  std::byte* returned = a.data();
  std::atomic<bool> got{false};
  std::byte* got_data = nullptr;
  {
    std::jthread waiter([&] {
      auto c = pool.acquire(BufferPool::Clock::now() + 30s);
      got_data = c.data();
      got.store(true);
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(got.load()) << "acquire returned while every buffer was leased";
    a.release();
  }
  EXPECT_TRUE(got.load());
  EXPECT_EQ(got_data, returned);
  EXPECT_EQ(pool.allocated_buffers(), 2u);
}

TEST(BufferPoolTest, DeadlineAndStopEndTheWait) {
  BufferPool pool(small_pool(4096, 1));
  auto only = pool.acquire();
  auto start = BufferPool::Clock::now();
  try {
    pool.acquire(start + 30ms);
    FAIL() << "acquire on an empty pool returned";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient);
    EXPECT_NE(std::string(e.what()).find("buffer pool: no buffer free after"), std::string::npos) << e.what();
  }
  EXPECT_GE(BufferPool::Clock::now() - start, 30ms);

  std::stop_source stop;
  std::jthread stopper([&] {
    std::this_thread::sleep_for(20ms);
    stop.request_stop();
  });
  try {
    pool.acquire(BufferPool::Clock::time_point::max(), stop.get_token());
    FAIL() << "acquire ignored the stop token";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kOther);
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
}

TEST(BufferPoolTest, LeasesMove) {
  BufferPool pool(small_pool(4096, 2));
  BufferPool::Lease a = pool.acquire();
  std::byte* p = a.data();
  BufferPool::Lease b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is what is tested
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(pool.leased_buffers(), 1u);
  BufferPool::Lease c = pool.acquire();
  c = std::move(b);  // c's old buffer goes back
  EXPECT_EQ(pool.leased_buffers(), 1u);
  c.release();
  c.release();  // idempotent
  EXPECT_EQ(pool.leased_buffers(), 0u);
}

TEST(BufferPoolTest, NeverMoreLeasesThanBuffersUnderContention) {
  BufferPool pool(small_pool(4096, 3));
  std::atomic<int> out{0};
  std::atomic<int> max_out{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 500; ++i) {
          auto lease = pool.acquire(BufferPool::Clock::now() + 30s);
          int now = out.fetch_add(1) + 1;
          int seen = max_out.load();
          while (now > seen && !max_out.compare_exchange_weak(seen, now)) {
          }
          lease.bytes()[0] = std::byte{static_cast<unsigned char>(i)};
          out.fetch_sub(1);
        }
      });
    }
  }
  EXPECT_LE(max_out.load(), 3);
  EXPECT_EQ(pool.leased_buffers(), 0u);
  EXPECT_LE(pool.allocated_buffers(), 3u);
}

TEST(BufferPoolTest, PrefaultAllocatesUpFront) {
  BufferPool pool(small_pool(1 << 20, 4));
  auto held = pool.acquire();
  EXPECT_EQ(pool.prefault(3), 3u);
  EXPECT_EQ(pool.prefault(100), 4u);  // capped at max_buffers()
  EXPECT_EQ(pool.leased_buffers(), 1u);
  std::vector<BufferPool::Lease> rest;
  for (int i = 0; i < 3; ++i) rest.push_back(pool.acquire());
  EXPECT_FALSE(pool.try_acquire().has_value());
  EXPECT_EQ(pool.allocated_buffers(), 4u);
}

TEST(BufferPoolTest, RejectsBadOptions) {
  BufferPoolOptions o;
  o.alignment = 3000;
  EXPECT_THROW(BufferPool{o}, UsageError);
  o = {};
  o.buffer_bytes = 0;
  EXPECT_THROW(BufferPool{o}, UsageError);
}

}  // namespace
}  // namespace shardpoint
