#include "comm/thread_communicator.h"

#include <fmt/format.h>

#include <cstring>
#include <thread>

#include "shardpoint/error.h"

namespace shardpoint::comm {

namespace {

using Clock = std::chrono::steady_clock;

// What one rank brings to one step: which collective it called, and its bytes.
struct Contribution {
  std::string signature;          // e.g. "broadcast(root 0)"; must match on every rank
  std::vector<std::string> data;  // op-specific; see ThreadCommunicator
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.empty() ? "none" : out;
}

std::string describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// The rendezvous shared by the ranks of a group. One step at a time: every rank deposits its
// Contribution (phase kCollecting); when the last one arrives the step is complete (kDraining)
// and each rank reads what it needs; when the last one has read, the slots are cleared for the
// next step. All fields are guarded by mu.
struct ThreadGroup::State {
  explicit State(int n) : n(n) { reset(); }

  void reset() SP_REQUIRES(mu) {
    phase = Phase::kCollecting;
    arrived = departed = 0;
    slots.assign(n, Contribution{});
    deposited.assign(n, false);
    finished.assign(n, false);
    aborted = false;
    abort_reason.clear();
    abort_origin = -1;
  }

  // The first abort wins; its rank is the root cause run() reports.
  void abort_locked(int rank, std::string reason) SP_REQUIRES(mu) {
    if (!aborted) {
      aborted = true;
      abort_reason = std::move(reason);
      abort_origin = rank;
    }
    cv.notify_all();
  }

  void on_failure(int rank, const std::string& what) {
    MutexLock lock(mu);
    abort_locked(rank, fmt::format("rank {} failed: {}", rank, what));
  }

  void on_finished(int rank) {
    MutexLock lock(mu);
    finished[rank] = true;
    cv.notify_all();
  }

  // Waits until pred() or the deadline; false on timeout.
  template <typename Pred>
  bool wait(Timeout timeout, Clock::time_point deadline, Pred pred) SP_REQUIRES(mu) {
    if (timeout == kNoTimeout) {
      cv.wait(mu, pred);
      return true;
    }
    return cv.wait_until(mu, deadline, pred);
  }

  // One step for `rank`: deposit `mine`, wait for every rank, return read(slots).
  template <typename Read>
  auto exchange(int rank, Contribution mine, Timeout timeout, Read read) {
    const auto deadline = timeout == kNoTimeout ? Clock::time_point::max() : Clock::now() + timeout;
    const std::string signature = mine.signature;
    MutexLock lock(mu);

    // 1. Wait until the previous step has been read by every rank.
    if (!wait(timeout, deadline, [&]() SP_REQUIRES(mu) { return aborted || phase == Phase::kCollecting; })) {
      std::string reason = fmt::format("rank {}: {}: timed out waiting for the other ranks to finish the "
                                       "previous collective",
                                       rank, signature);
      abort_locked(rank, reason);
      throw CommError(reason);
    }
    if (aborted) throw CommError("group aborted: " + abort_reason);

    // 2. Deposit; the last rank to arrive checks that everyone called the same collective.
    slots[rank] = std::move(mine);
    deposited[rank] = true;
    if (++arrived == n) {
      for (int r = 0; r < n; ++r) {
        if (slots[r].signature != slots[0].signature) {
          std::string calls;
          for (int q = 0; q < n; ++q) calls += fmt::format("{}rank {}: {}", q ? ", " : "", q, slots[q].signature);
          std::string reason = "collective mismatch: " + calls;
          abort_locked(rank, reason);
          throw CommError(reason);
        }
      }
      phase = Phase::kDraining;
      cv.notify_all();
    } else {
      auto someone_left = [&]() SP_REQUIRES(mu) {
        for (int r = 0; r < n; ++r) {
          if (!deposited[r] && finished[r]) return true;
        }
        return false;
      };
      const bool in_time = wait(
          timeout, deadline, [&]() SP_REQUIRES(mu) { return aborted || phase == Phase::kDraining || someone_left(); });
      if (phase != Phase::kDraining) {
        if (aborted) throw CommError("group aborted: " + abort_reason);
        std::vector<int> present, missing, left;
        for (int r = 0; r < n; ++r) {
          (deposited[r] ? present : missing).push_back(r);
          if (!deposited[r] && finished[r]) left.push_back(r);
        }
        std::string reason = in_time
                                 ? fmt::format("rank {}: {}: rank(s) {} left the group without joining it (joined: {})",
                                               rank, signature, join_ranks(left), join_ranks(present))
                                 : fmt::format("rank {}: {}: timed out waiting for rank(s) {} (joined: {})", rank,
                                               signature, join_ranks(missing), join_ranks(present));
        abort_locked(rank, reason);
        throw CommError(reason);
      }
    }

    // 3. The step is complete (it stays so until this rank departs): read, then depart.
    auto result = read(slots);
    if (++departed == n) {
      for (auto& s : slots) s = Contribution{};
      deposited.assign(n, false);
      arrived = departed = 0;
      phase = Phase::kCollecting;
      cv.notify_all();
    }
    return result;
  }

  enum class Phase { kCollecting, kDraining };

  const int n;
  Mutex mu;
  CondVar cv;  // notified on every change below
  Phase phase SP_GUARDED_BY(mu) = Phase::kCollecting;
  int arrived SP_GUARDED_BY(mu) = 0;                  // ranks deposited in this step
  int departed SP_GUARDED_BY(mu) = 0;                 // ranks done reading this step
  std::vector<Contribution> slots SP_GUARDED_BY(mu);  // indexed by rank
  std::vector<bool> deposited SP_GUARDED_BY(mu);      // indexed by rank
  std::vector<bool> finished SP_GUARDED_BY(mu);       // rank's function returned or threw
  bool aborted SP_GUARDED_BY(mu) = false;             // every later wait throws
  std::string abort_reason SP_GUARDED_BY(mu);
  int abort_origin SP_GUARDED_BY(mu) = -1;  // rank whose failure came first
};

namespace {

std::string encode_int(std::int64_t v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}

std::string encode_double(double v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}

template <typename T>
T decode(const std::string& s) {
  T v;
  std::memcpy(&v, s.data(), sizeof v);
  return v;
}

// Rank `rank` of a ThreadGroup. Contribution::data per collective: barrier {}, broadcast {bytes}
// on root and {} elsewhere, gather/all_gather {bytes}, scatter the pieces on root and {}
// elsewhere, all_reduce {8 bytes of the value}.
class ThreadCommunicator final : public Communicator {
 public:
  using State = ThreadGroup::State;

  ThreadCommunicator(int rank, State& state, CommOptions options) : Communicator(options), rank_(rank), state_(state) {}

  int rank() const override { return rank_; }
  int world_size() const override { return state_.n; }
  std::string_view name() const override { return "threads"; }

 protected:
  void do_barrier(Timeout timeout) override {
    state_.exchange(rank_, {"barrier", {}}, timeout, [](const auto&) { return 0; });
  }

  std::string do_broadcast(std::string bytes, int root, Timeout timeout) override {
    Contribution mine{fmt::format("broadcast(root {})", root), {}};
    if (rank_ == root) mine.data.push_back(std::move(bytes));
    return state_.exchange(rank_, std::move(mine), timeout,
                           [&](const std::vector<Contribution>& s) { return s[root].data.at(0); });
  }

  std::vector<std::string> do_gather(std::string bytes, int root, Timeout timeout) override {
    Contribution mine{fmt::format("gather(root {})", root), {}};
    mine.data.push_back(std::move(bytes));
    return state_.exchange(rank_, std::move(mine), timeout, [&](std::vector<Contribution>& s) {
      std::vector<std::string> out;
      if (rank_ == root) {
        for (auto& c : s) out.push_back(std::move(c.data.at(0)));  // only root reads them
      }
      return out;
    });
  }

  std::vector<std::string> do_all_gather(std::string bytes, Timeout timeout) override {
    Contribution mine{"all_gather", {}};
    mine.data.push_back(std::move(bytes));
    return state_.exchange(rank_, std::move(mine), timeout, [](const std::vector<Contribution>& s) {
      std::vector<std::string> out;
      for (const auto& c : s) out.push_back(c.data.at(0));
      return out;
    });
  }

  std::string do_scatter(std::vector<std::string> pieces, int root, Timeout timeout) override {
    Contribution mine{fmt::format("scatter(root {})", root), std::move(pieces)};
    return state_.exchange(rank_, std::move(mine), timeout, [&](std::vector<Contribution>& s) {
      return std::move(s[root].data.at(rank_));  // each piece is read by its rank only
    });
  }

  std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp op, Timeout timeout) override {
    Contribution mine{fmt::format("all_reduce(int64 {})", reduce_op_name(op)), {encode_int(value)}};
    return state_.exchange(rank_, std::move(mine), timeout, [&](const std::vector<Contribution>& s) {
      std::int64_t acc = decode<std::int64_t>(s[0].data.at(0));
      for (std::size_t r = 1; r < s.size(); ++r) acc = reduce_values(acc, decode<std::int64_t>(s[r].data.at(0)), op);
      return acc;
    });
  }

  double do_all_reduce_double(double value, ReduceOp op, Timeout timeout) override {
    Contribution mine{fmt::format("all_reduce(double {})", reduce_op_name(op)), {encode_double(value)}};
    return state_.exchange(rank_, std::move(mine), timeout, [&](const std::vector<Contribution>& s) {
      // Same order on every rank, so every rank gets bit-identical sums.
      double acc = decode<double>(s[0].data.at(0));
      for (std::size_t r = 1; r < s.size(); ++r) acc = reduce_values(acc, decode<double>(s[r].data.at(0)), op);
      return acc;
    });
  }

 private:
  const int rank_;
  State& state_;
};

}  // namespace

ThreadGroup::ThreadGroup(int world_size, CommOptions options) : world_size_(world_size), options_(options) {
  if (world_size < 1) throw UsageError(fmt::format("ThreadGroup: world size {} must be at least 1", world_size));
  state_ = std::make_unique<State>(world_size);
}

ThreadGroup::~ThreadGroup() = default;

std::vector<std::exception_ptr> ThreadGroup::run_all(const std::function<void(Communicator&)>& fn) {
  MutexLock run_lock(run_mutex_);
  {
    MutexLock lock(state_->mu);
    state_->reset();
  }
  std::vector<std::exception_ptr> errors(world_size_);
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  for (int r = 0; r < world_size_; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(r, *state_, options_));
  {
    std::vector<std::jthread> threads;
    try {
      for (int r = 0; r < world_size_; ++r) {
        threads.emplace_back([&, r] {
          try {
            fn(*comms[r]);
          } catch (...) {
            errors[r] = std::current_exception();
            state_->on_failure(r, describe_exception(errors[r]));
          }
          state_->on_finished(r);
        });
      }
    } catch (...) {
      // Could not start every rank: release the started ones, join them, report.
      state_->on_failure(static_cast<int>(threads.size()), "could not start its thread");
      threads.clear();
      throw;
    }
  }  // joins
  return errors;
}

void ThreadGroup::run(const std::function<void(Communicator&)>& fn) {
  std::vector<std::exception_ptr> errors = run_all(fn);
  int origin;
  {
    MutexLock lock(state_->mu);
    origin = state_->abort_origin;
  }
  if (origin >= 0 && origin < world_size_ && errors[origin]) std::rethrow_exception(errors[origin]);
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace shardpoint::comm
