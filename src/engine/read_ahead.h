#pragma once
// ReadAhead: announces the byte ranges parallel readers will read, ahead of them, in the
// order they take their tasks (ByteSource::will_need). Used by load() (checkpoint_load.cc)
// and by PlannedReader::read_tensors (planned_io.cc, the DCP reader of the Python package).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardpoint/byte_stream.h"
#include "shardpoint/mutex.h"

namespace shardpoint::engine {

// Announces (ByteSource::will_need) the byte ranges the reader threads will read, in the
// order they take their tasks, up to kReadAheadBytes ahead of the task being started: the
// device gets a deep queue of large reads whatever the thread count, and the readers'
// preads, headers included, find their pages in the cache or in flight.
class ReadAhead {
 public:
  struct Range {
    std::shared_ptr<const ByteSource> file;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  static constexpr std::uint64_t kReadAheadBytes = std::uint64_t{64} << 20;
  // Largest single hint, so the window advances smoothly.
  static constexpr std::uint64_t kHintBytes = std::uint64_t{8} << 20;

  // ranges_of_task[i]: what task i reads (file order within a task).
  explicit ReadAhead(std::vector<std::vector<Range>> ranges_of_task) {
    std::uint64_t total = 0;
    for (std::size_t t = 0; t < ranges_of_task.size(); ++t) {
      task_start_.push_back(total);
      for (Range& r : ranges_of_task[t]) {
        // Split large ranges so the window's leading edge moves in kHintBytes steps.
        for (std::uint64_t done = 0; done < r.length; done += kHintBytes) {
          const std::uint64_t n = std::min(kHintBytes, r.length - done);
          total += n;
          if (!hints_.empty() && hints_.back().file == r.file &&
              hints_.back().offset + hints_.back().length == r.offset + done &&
              hints_.back().length + n <= kHintBytes) {
            // Blobs follow each other in a file: one hint for many small ones (a
            // will_need costs a syscall even when the pages are cached).
            hints_.back().length += n;
            hint_end_.back() = total;
            continue;
          }
          hints_.push_back({r.file, r.offset + done, n});
          hint_end_.push_back(total);
        }
      }
    }
  }

  // Called by a reader as it starts task `task` (tasks start in increasing order).
  void starting(std::size_t task) {
    if (!mu_.try_lock()) return;  // another reader is advancing the window
    MutexLock lock(mu_, std::adopt_lock);
    const std::uint64_t limit = (task < task_start_.size() ? task_start_[task] : 0) + kReadAheadBytes;
    while (next_ < hints_.size() && (next_ == 0 || hint_end_[next_ - 1] < limit)) {
      const Range& h = hints_[next_++];
      h.file->will_need(h.offset, h.length);
    }
  }

 private:
  std::vector<std::uint64_t> task_start_;  // bytes announced before task i's ranges
  std::vector<Range> hints_;
  std::vector<std::uint64_t> hint_end_;  // cumulative bytes through hint i
  Mutex mu_;
  std::size_t next_ SP_GUARDED_BY(mu_) = 0;
};

}  // namespace shardpoint::engine
