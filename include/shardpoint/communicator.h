// Communicator: the collectives shardpoint's engine needs between the ranks of one job, on
// plain bytes (plans, metadata, error strings), never on tensors.
//
// Every rank of the job holds one Communicator and calls the same collectives in the same order
// with the same `root` (SPMD, as c10d process groups require). Each call is marked
//   (all ranks)    every rank must call it; it returns on every rank;
//   (coordinator)  every rank must call it, but the result is only meaningful on `root`
//                  (other ranks get an empty value).
// Every call takes a timeout; when another rank does not take part in time (it died or hangs)
// the call throws CommError instead of blocking forever. Ranks calling different collectives
// are a bug: the thread driver reports it, Gloo and MPI may time out or exchange garbage.
//
// Drivers (each in its own file): single_communicator.h (a world of 1), thread_communicator.h
// (N ranks as threads of one process, for tests), gloo_communicator.h (c10d ProcessGroupGloo over
// TCPStore, library sp_comm_gloo), mpi_communicator.h (OpenMPI, library sp_comm_mpi), and
// communicator_from_env.h (picks one from the environment, library sp_comm_env).
//
// Errors: every failure is a CommError whose message names the driver, the rank, the
// operation, the elapsed time and the timeout, e.g.
//   "gloo rank 2/4: all_gather(12 bytes) failed after 1.00 s (timeout 1 s): <driver detail>".
// Invalid arguments (root out of range, wrong number of scatter pieces) are UsageError, thrown
// before anything is sent; the other ranks then time out. After a CommError the communicator is
// broken: the collective sequence of the ranks no longer matches, so every later call throws
// CommError at once (naming the first failure). Destroying it is always allowed.
//
// Thread-safety: rank(), world_size(), name() and options() are safe from any thread.
// Collectives may be called from any thread, but the caller must not issue two at the same time
// on one Communicator (they are serialized by a mutex; two threads would still race for the order
// of the collective sequence, which must be the same on every rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/mutex.h"

namespace shardpoint::comm {

using Timeout = std::chrono::milliseconds;

// Waits as long as it takes (c10d's Store::kNoTimeout, also zero). Use only where a deadlock is
// impossible or a supervisor kills the job; a dead peer then blocks the call for ever.
inline constexpr Timeout kNoTimeout = Timeout::zero();
// Use CommOptions::timeout of the communicator (the default argument of every collective).
inline constexpr Timeout kDefaultTimeout = Timeout(-1);

struct CommOptions {
  // Deadline of each collective called with kDefaultTimeout. 300 s as c10d's default: long
  // enough for the slowest rank to finish writing its shards before the final gather. Lower it
  // in tests so a missing rank fails fast; raise it when ranks do long work between collectives.
  Timeout timeout = std::chrono::seconds(300);
};

enum class ReduceOp { kSum, kMin, kMax };

// One failed rank, as returned by Communicator::all_errors().
struct RankError {
  int rank = 0;
  std::string message;
  bool operator==(const RankError&) const = default;
};

class Communicator {
 public:
  explicit Communicator(CommOptions options) : options_(options) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This rank, in [0, world_size()). Rank 0 is the coordinator.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The driver: "single", "threads", "gloo" or "mpi".
  virtual std::string_view name() const = 0;
  bool is_coordinator() const { return rank() == 0; }
  const CommOptions& options() const { return options_; }

  // (all ranks) Returns once every rank has called barrier().
  // Throws CommError on timeout or when a peer failed.
  void barrier(Timeout timeout = kDefaultTimeout);

  // (all ranks) Returns root's `bytes` on every rank; `bytes` is ignored on the other ranks.
  // REQUIRES: 0 <= root < world_size() (else UsageError).
  std::string broadcast(std::string bytes, int root = 0, Timeout timeout = kDefaultTimeout);

  // (coordinator) On root returns every rank's `bytes`, indexed by rank; on other ranks returns
  // an empty vector. Sizes may differ between ranks. REQUIRES: 0 <= root < world_size().
  std::vector<std::string> gather(std::string bytes, int root = 0, Timeout timeout = kDefaultTimeout);

  // (all ranks) Returns every rank's `bytes`, indexed by rank. Sizes may differ between ranks.
  std::vector<std::string> all_gather(std::string bytes, Timeout timeout = kDefaultTimeout);

  // (all ranks) Rank r gets pieces[r] from root. `pieces` is read on root only.
  // REQUIRES: on root, pieces.size() == world_size() (else UsageError); 0 <= root < world_size().
  std::string scatter(std::vector<std::string> pieces, int root = 0, Timeout timeout = kDefaultTimeout);

  // (all ranks) Returns op applied to every rank's `value`, on every rank.
  std::int64_t all_reduce(std::int64_t value, ReduceOp op, Timeout timeout = kDefaultTimeout);
  double all_reduce(double value, ReduceOp op, Timeout timeout = kDefaultTimeout);

  // (all ranks) True on every rank when every rank passed local_ok = true.
  bool all_ok(bool local_ok, Timeout timeout = kDefaultTimeout);

  // (all ranks) Every rank passes "" when it succeeded, or its error message. Returns the
  // failures of all ranks ordered by rank (empty when all succeeded), the same on every rank.
  std::vector<RankError> all_errors(std::string local_error, Timeout timeout = kDefaultTimeout);

  // (all ranks) "If any rank failed, every rank gets the error." Every rank passes its own
  // failure (nullptr when it succeeded). Returns normally when no rank failed. Otherwise:
  // a rank that failed rethrows its own exception unchanged; the others throw the error of the
  // lowest failed rank with the same category (FormatError, StorageError with its kind,
  // PlanError, UsageError, CommError, or Error for anything else), its message prefixed with
  // "rank R: " and suffixed with " (and N more ranks failed)" when several failed.
  // A CommError of this exchange itself is thrown as is.
  void rethrow_if_any_failed(const std::exception_ptr& local_error, Timeout timeout = kDefaultTimeout);

 protected:
  // Driver hooks, called under the mutex with validated arguments and a resolved timeout
  // (kNoTimeout or a positive duration). They throw CommError (or any std::exception, which
  // the base class converts) with a detail message; the base class adds rank, op and timeout.
  virtual void do_barrier(Timeout timeout) = 0;
  virtual std::string do_broadcast(std::string bytes, int root, Timeout timeout) = 0;
  virtual std::vector<std::string> do_gather(std::string bytes, int root, Timeout timeout) = 0;
  virtual std::vector<std::string> do_all_gather(std::string bytes, Timeout timeout) = 0;
  virtual std::string do_scatter(std::vector<std::string> pieces, int root, Timeout timeout) = 0;
  virtual std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp op, Timeout timeout) = 0;
  virtual double do_all_reduce_double(double value, ReduceOp op, Timeout timeout) = 0;

 private:
  template <typename Fn>
  auto run_op(const std::string& op, Timeout timeout, Fn&& fn);
  void check_root(const char* op, int root) const;

  const CommOptions options_;
  Mutex mutex_;
  std::string broken_ SP_GUARDED_BY(mutex_);  // first failure
};

// Applies op to two values (shared by drivers that reduce by hand).
std::int64_t reduce_values(std::int64_t a, std::int64_t b, ReduceOp op);
double reduce_values(double a, double b, ReduceOp op);
const char* reduce_op_name(ReduceOp op);

// "300 s", "1.50 s", "no timeout": how error messages print a timeout.
std::string describe_timeout(Timeout timeout);

// The wire form of an exception used by rethrow_if_any_failed: its category, then its message.
// encode_error(nullptr) is "". throw_decoded_error throws an exception of the encoded category
// with message prefix + message + suffix (Error for an unknown category).
std::string encode_error(const std::exception_ptr& error);
[[noreturn]] void throw_decoded_error(std::string_view encoded, const std::string& prefix,
                                      const std::string& suffix = "");

}  // namespace shardpoint::comm
