#include "shardpoint/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "comm/shared_error.h"
#include "shardpoint/error.h"

namespace shardpoint::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string describe_seconds(Clock::duration d) {
  return fmt::format("{:.2f} s", std::chrono::duration<double>(d).count());
}

// The mark of an exception throw_decoded_error raised: E for its catchers, SharedMark for
// is_shared_error().
struct SharedMark {
  virtual ~SharedMark() = default;
};
template <typename E>
class SharedError final : public E, public SharedMark {
 public:
  using E::E;
};

}  // namespace

std::string describe_timeout(Timeout timeout) {
  if (timeout == kNoTimeout) return "no timeout";
  if (timeout.count() % 1000 == 0) return fmt::format("{} s", timeout.count() / 1000);
  return fmt::format("{:.2f} s", static_cast<double>(timeout.count()) / 1000.0);
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::int64_t reduce_values(std::int64_t a, std::int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return a;
}

double reduce_values(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return a;
}

// Runs one collective: one at a time, refuses when broken, resolves the timeout, and turns any
// failure into a CommError naming driver, rank, op, elapsed time and timeout.
template <typename Fn>
auto Communicator::run_op(const std::string& op, Timeout timeout, Fn&& fn) {
  if (timeout == kDefaultTimeout) timeout = options_.timeout;
  if (timeout < Timeout::zero()) {
    throw UsageError(
        fmt::format("{} rank {}/{}: {}: negative timeout {} ms", name(), rank(), world_size(), op, timeout.count()));
  }
  MutexLock lock(mutex_);
  if (!broken_.empty()) {
    throw CommError(fmt::format("{} rank {}/{}: {}: communicator unusable after an earlier failure: {}", name(), rank(),
                                world_size(), op, broken_));
  }
  const auto start = Clock::now();
  std::string detail;
  try {
    return fn(timeout);
  } catch (const std::exception& e) {
    detail = e.what();
  } catch (...) {
    detail = "unknown exception";
  }
  std::string message = fmt::format("{} rank {}/{}: {} failed after {} (timeout {}): {}", name(), rank(), world_size(),
                                    op, describe_seconds(Clock::now() - start), describe_timeout(timeout), detail);
  broken_ = message;
  throw CommError(message);
}

void Communicator::check_root(const char* op, int root) const {
  if (root < 0 || root >= world_size()) {
    throw UsageError(fmt::format("{} rank {}/{}: {}: root {} out of range [0, {})", name(), rank(), world_size(), op,
                                 root, world_size()));
  }
}

void Communicator::barrier(Timeout timeout) {
  run_op("barrier", timeout, [&](Timeout t) { do_barrier(t); });
}

std::string Communicator::broadcast(std::string bytes, int root, Timeout timeout) {
  check_root("broadcast", root);
  const std::string op = rank() == root ? fmt::format("broadcast(root {}, {} bytes)", root, bytes.size())
                                        : fmt::format("broadcast(root {})", root);
  return run_op(op, timeout, [&](Timeout t) { return do_broadcast(std::move(bytes), root, t); });
}

std::vector<std::string> Communicator::gather(std::string bytes, int root, Timeout timeout) {
  check_root("gather", root);
  const std::string op = fmt::format("gather(root {}, {} bytes)", root, bytes.size());
  return run_op(op, timeout, [&](Timeout t) { return do_gather(std::move(bytes), root, t); });
}

std::vector<std::string> Communicator::all_gather(std::string bytes, Timeout timeout) {
  const std::string op = fmt::format("all_gather({} bytes)", bytes.size());
  return run_op(op, timeout, [&](Timeout t) { return do_all_gather(std::move(bytes), t); });
}

std::string Communicator::scatter(std::vector<std::string> pieces, int root, Timeout timeout) {
  check_root("scatter", root);
  if (rank() == root && static_cast<int>(pieces.size()) != world_size()) {
    throw UsageError(fmt::format("{} rank {}/{}: scatter: root got {} pieces, expected world size {}", name(), rank(),
                                 world_size(), pieces.size(), world_size()));
  }
  if (rank() != root) pieces.clear();
  const std::string op = fmt::format("scatter(root {})", root);
  return run_op(op, timeout, [&](Timeout t) { return do_scatter(std::move(pieces), root, t); });
}

std::int64_t Communicator::all_reduce(std::int64_t value, ReduceOp op, Timeout timeout) {
  return run_op(fmt::format("all_reduce(int64 {})", reduce_op_name(op)), timeout,
                [&](Timeout t) { return do_all_reduce_int(value, op, t); });
}

double Communicator::all_reduce(double value, ReduceOp op, Timeout timeout) {
  return run_op(fmt::format("all_reduce(double {})", reduce_op_name(op)), timeout,
                [&](Timeout t) { return do_all_reduce_double(value, op, t); });
}

bool Communicator::all_ok(bool local_ok, Timeout timeout) {
  return all_reduce(std::int64_t{local_ok ? 1 : 0}, ReduceOp::kMin, timeout) == 1;
}

std::vector<RankError> Communicator::all_errors(std::string local_error, Timeout timeout) {
  std::vector<std::string> all = all_gather(std::move(local_error), timeout);
  std::vector<RankError> errors;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) errors.push_back({static_cast<int>(r), std::move(all[r])});
  }
  return errors;
}

void Communicator::rethrow_if_any_failed(const std::exception_ptr& local_error, Timeout timeout) {
  std::vector<RankError> errors = all_errors(encode_error(local_error), timeout);
  if (errors.empty()) return;
  if (local_error) std::rethrow_exception(local_error);
  const std::string suffix =
      errors.size() > 1 ? fmt::format(" (and {} more ranks failed)", errors.size() - 1) : std::string();
  throw_decoded_error(errors.front().message, fmt::format("rank {}: ", errors.front().rank), suffix);
}

// Wire form: "<category>\n<message>", category one of format, storage:<kind>, plan, usage, comm,
// error (any other exception). Only this file reads it; change both sides together.
std::string encode_error(const std::exception_ptr& error) {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const FormatError& e) {
    return std::string("format\n") + e.what();
  } catch (const StorageError& e) {
    return fmt::format("storage:{}\n{}", static_cast<int>(e.kind()), e.what());
  } catch (const PlanError& e) {
    return std::string("plan\n") + e.what();
  } catch (const UsageError& e) {
    return std::string("usage\n") + e.what();
  } catch (const CommError& e) {
    return std::string("comm\n") + e.what();
  } catch (const std::exception& e) {
    return std::string("error\n") + e.what();
  } catch (...) {
    return "error\nunknown exception";
  }
}

void throw_decoded_error(std::string_view encoded, const std::string& prefix, const std::string& suffix) {
  const std::size_t nl = encoded.find('\n');
  const std::string_view category = nl == std::string_view::npos ? std::string_view("error") : encoded.substr(0, nl);
  const std::string message =
      prefix + std::string(nl == std::string_view::npos ? encoded : encoded.substr(nl + 1)) + suffix;
  if (category == "format") throw SharedError<FormatError>(message);
  if (category == "plan") throw SharedError<PlanError>(message);
  if (category == "usage") throw SharedError<UsageError>(message);
  if (category == "comm") throw SharedError<CommError>(message);
  if (category.starts_with("storage:")) {
    int kind = static_cast<int>(StorageError::Kind::kOther);
    const std::string_view digits = category.substr(8);
    std::from_chars(digits.data(), digits.data() + digits.size(), kind);
    if (kind < 0 || kind > static_cast<int>(StorageError::Kind::kAlreadyExists)) {
      kind = static_cast<int>(StorageError::Kind::kOther);
    }
    throw SharedError<StorageError>(static_cast<StorageError::Kind>(kind), message);
  }
  throw SharedError<Error>(message);
}

bool is_shared_error(const std::exception& error) { return dynamic_cast<const SharedMark*>(&error) != nullptr; }

}  // namespace shardpoint::comm
