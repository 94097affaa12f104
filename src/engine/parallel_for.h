#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace shardpoint::engine {

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller's included); every
// exception is captured and the first one (by index) rethrown after all threads joined.
// After a failure no new index is started.
inline void parallel_for(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (;;) {
      if (failed.load()) return;
      const std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
        failed.store(true);
      }
    }
  };
  const std::size_t count = std::min(n, std::max<std::size_t>(threads, 1));
  {
    std::vector<std::jthread> pool;
    for (std::size_t t = 1; t < count; ++t) pool.emplace_back(worker);
    worker();
  }  // joined
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace shardpoint::engine
