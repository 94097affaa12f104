#include "comm/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"

namespace shardpoint::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Process-wide MPI state: whether we initialized MPI (then we finalize it at exit) and
// whether a collective was abandoned (then finalizing could hang, so we do not).
Mutex g_mpi_mutex;
bool g_we_initialized SP_GUARDED_BY(g_mpi_mutex) = false;
bool g_abandoned SP_GUARDED_BY(g_mpi_mutex) = false;

void finalize_at_exit() {
  MutexLock lock(g_mpi_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !g_abandoned && !finalized) MPI_Finalize();
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<std::size_t>(len));
}

void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("{}: {}", call, mpi_error_text(rc)));
}

void ensure_mpi_initialized() {
  MutexLock lock(g_mpi_mutex);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw CommError("mpi: MPI was already finalized in this process");
  if (initialized) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  g_we_initialized = true;
  std::atexit(finalize_at_exit);
}

int checked_count(std::int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX) {
    throw UsageError(fmt::format("mpi: {} of {} bytes exceeds MPI's int count limit ({} bytes)", what, n, INT_MAX));
  }
  return static_cast<int>(n);
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(CommOptions options) : Communicator(options) {
    ensure_mpi_initialized();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &world_size_), "MPI_Comm_size");
  }

  ~MpiCommunicator() override {
    // A communicator with an abandoned collective cannot be freed safely; leak it.
    if (!abandoned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view name() const override { return "mpi"; }

 protected:
  void do_barrier(Timeout timeout) override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    wait(req, timeout);
  }

  std::string do_broadcast(std::string bytes, int root, Timeout timeout) override {
    std::int64_t size = static_cast<std::int64_t>(bytes.size());
    MPI_Request req;
    check(MPI_Ibcast(&size, 1, MPI_INT64_T, root, comm_, &req), "MPI_Ibcast");
    wait(req, timeout);
    const int count = checked_count(size, "broadcast payload");  // same verdict on every rank
    if (rank_ != root) bytes.assign(static_cast<std::size_t>(size), '\0');
    if (count > 0) {
      check(MPI_Ibcast(bytes.data(), count, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
      wait(req, timeout);
    }
    return bytes;
  }

  std::vector<std::string> do_gather(std::string bytes, int root, Timeout timeout) override {
    std::vector<std::int64_t> sizes = all_gather_sizes(static_cast<std::int64_t>(bytes.size()), timeout);
    std::vector<int> counts, displs;
    const std::int64_t total = layout(sizes, counts, displs);
    std::string all(rank_ == root ? static_cast<std::size_t>(total) : 0, '\0');
    MPI_Request req;
    check(MPI_Igatherv(bytes.data(), counts[rank_], MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, root,
                       comm_, &req),
          "MPI_Igatherv");
    wait(req, timeout);
    std::vector<std::string> out;
    if (rank_ == root) out = split(all, counts, displs);
    return out;
  }

  std::vector<std::string> do_all_gather(std::string bytes, Timeout timeout) override {
    std::vector<std::int64_t> sizes = all_gather_sizes(static_cast<std::int64_t>(bytes.size()), timeout);
    std::vector<int> counts, displs;
    const std::int64_t total = layout(sizes, counts, displs);
    std::string all(static_cast<std::size_t>(total), '\0');
    MPI_Request req;
    check(MPI_Iallgatherv(bytes.data(), counts[rank_], MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE,
                          comm_, &req),
          "MPI_Iallgatherv");
    wait(req, timeout);
    return split(all, counts, displs);
  }

  std::string do_scatter(std::vector<std::string> pieces, int root, Timeout timeout) override {
    std::vector<std::int64_t> sizes(world_size_, 0);
    if (rank_ == root) {
      for (int r = 0; r < world_size_; ++r) sizes[r] = static_cast<std::int64_t>(pieces[r].size());
    }
    MPI_Request req;
    check(MPI_Ibcast(sizes.data(), world_size_, MPI_INT64_T, root, comm_, &req), "MPI_Ibcast");
    wait(req, timeout);
    std::vector<int> counts, displs;
    layout(sizes, counts, displs);
    std::string all;  // root: the pieces back to back (MPI_Iscatterv reads one buffer)
    if (rank_ == root) {
      for (const auto& p : pieces) all += p;
    }
    std::string mine(static_cast<std::size_t>(counts[rank_]), '\0');
    check(MPI_Iscatterv(all.data(), counts.data(), displs.data(), MPI_BYTE, mine.data(), counts[rank_], MPI_BYTE, root,
                        comm_, &req),
          "MPI_Iscatterv");
    wait(req, timeout);
    return mine;
  }

  std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp op, Timeout timeout) override {
    std::int64_t result = 0;
    MPI_Request req;
    check(MPI_Iallreduce(&value, &result, 1, MPI_INT64_T, to_mpi(op), comm_, &req), "MPI_Iallreduce");
    wait(req, timeout);
    return result;
  }

  double do_all_reduce_double(double value, ReduceOp op, Timeout timeout) override {
    double result = 0;
    MPI_Request req;
    check(MPI_Iallreduce(&value, &result, 1, MPI_DOUBLE, to_mpi(op), comm_, &req), "MPI_Iallreduce");
    wait(req, timeout);
    return result;
  }

 private:
  // Polls `req` until it completes or the timeout passes. Spins briefly, then sleeps with a
  // growing pause (at most 1 ms) so a waiting rank does not burn a core.
  void wait(MPI_Request& req, Timeout timeout) {
    if (timeout == kNoTimeout) {
      check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
      return;
    }
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    for (int polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (Clock::now() >= deadline) {
        abandoned_ = true;
        MutexLock lock(g_mpi_mutex);
        g_abandoned = true;
        throw CommError("timed out; the posted MPI collective cannot be cancelled, so this communicator is "
                        "unusable and MPI will not be finalized");
      }
      if (polls < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
      }
    }
  }

  std::vector<std::int64_t> all_gather_sizes(std::int64_t mine, Timeout timeout) {
    std::vector<std::int64_t> sizes(world_size_, 0);
    MPI_Request req;
    check(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm_, &req), "MPI_Iallgather");
    wait(req, timeout);
    return sizes;
  }

  // Counts and displacements for a *v collective; every rank computes the same, so a payload
  // over the int limit fails on every rank alike. Returns the total size.
  static std::int64_t layout(const std::vector<std::int64_t>& sizes, std::vector<int>& counts,
                             std::vector<int>& displs) {
    counts.clear();
    displs.clear();
    std::int64_t total = 0;
    for (std::int64_t s : sizes) {
      counts.push_back(checked_count(s, "payload"));
      displs.push_back(checked_count(total, "total payload"));
      total += s;
    }
    checked_count(total, "total payload");
    return total;
  }

  static std::vector<std::string> split(const std::string& all, const std::vector<int>& counts,
                                        const std::vector<int>& displs) {
    std::vector<std::string> out;
    out.reserve(counts.size());
    for (std::size_t r = 0; r < counts.size(); ++r) out.push_back(all.substr(displs[r], counts[r]));
    return out;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  bool abandoned_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(CommOptions options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace shardpoint::comm
