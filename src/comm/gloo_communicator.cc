// The one translation unit of comm/ that includes LibTorch (narrow c10d headers only; they
// compile in about 2 s, <torch/torch.h> would take 10).
#include "comm/gloo_communicator.h"

#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <optional>

#include "comm/env_int.h"
#include "shardpoint/error.h"

#ifndef USE_C10D_GLOO
#error "gloo_communicator.cc needs -DUSE_C10D_GLOO (link the Torch target: find_package(Torch))"
#endif

namespace shardpoint::comm {

namespace {

// Gloo needs a finite timeout; "no timeout" becomes 30 days.
constexpr Timeout kGlooForever = std::chrono::hours(24 * 30);

Timeout gloo_timeout(Timeout t) { return t == kNoTimeout ? kGlooForever : t; }

// c10::Error::what() carries a C++ backtrace; keep the message only.
[[noreturn]] void rethrow_as_comm_error(const std::string& context) {
  try {
    throw;
  } catch (const c10::Error& e) {
    throw CommError(context + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw CommError(context + e.what());
  }
}

// A uint8 tensor viewing `bytes` (no copy); the string must outlive the collective.
at::Tensor byte_view(std::string& bytes) {
  return at::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, at::TensorOptions(at::kByte));
}

at::Tensor int64_view(std::int64_t* values, std::size_t n) {
  return at::from_blob(values, {static_cast<std::int64_t>(n)}, at::TensorOptions(at::kLong));
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr == "::1" || addr.starts_with("127."); }

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& o) : Communicator(o.comm), rank_(o.rank), world_size_(o.world_size) {
    const std::string where = fmt::format("gloo rank {}/{}: joining the group at {}:{}: ", o.rank, o.world_size,
                                          o.master_addr, o.master_port);
    try {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<std::uint16_t>(o.master_port);
      store_options.isServer = o.rank == 0;
      store_options.numWorkers = static_cast<std::size_t>(o.world_size);
      store_options.waitWorkers = true;
      store_options.timeout = gloo_timeout(o.init_timeout);
      store_ = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);

      auto pg_options = c10d::ProcessGroupGloo::Options::create(gloo_timeout(o.comm.timeout));
      if (!o.interface.empty()) {
        pg_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(o.interface));
      } else if (is_loopback(o.master_addr)) {
        pg_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        pg_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, o.rank, o.world_size, pg_options);
    } catch (...) {
      rethrow_as_comm_error(where);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view name() const override { return "gloo"; }

 protected:
  void do_barrier(Timeout timeout) override {
    c10d::BarrierOptions opts;
    opts.timeout = gloo_timeout(timeout);
    wait(pg_->barrier(opts), timeout);
  }

  std::string do_broadcast(std::string bytes, int root, Timeout timeout) override {
    std::int64_t size = static_cast<std::int64_t>(bytes.size());
    broadcast_tensor(int64_view(&size, 1), root, timeout);
    if (rank_ != root) bytes.assign(static_cast<std::size_t>(size), '\0');
    if (size > 0) broadcast_tensor(byte_view(bytes), root, timeout);
    return bytes;
  }

  std::vector<std::string> do_gather(std::string bytes, int root, Timeout timeout) override {
    // Gloo gathers equal-sized tensors: learn every size, pad to the largest, trim after.
    std::vector<std::int64_t> sizes = all_gather_sizes(static_cast<std::int64_t>(bytes.size()), timeout);
    const std::int64_t max = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::string> out;
    if (rank_ == root) out.assign(world_size_, std::string(static_cast<std::size_t>(max), '\0'));
    if (max > 0) {
      bytes.resize(static_cast<std::size_t>(max));
      std::vector<at::Tensor> inputs{byte_view(bytes)};
      std::vector<std::vector<at::Tensor>> outputs;
      if (rank_ == root) {
        outputs.emplace_back();
        for (auto& s : out) outputs.back().push_back(byte_view(s));
      }
      c10d::GatherOptions opts;
      opts.rootRank = root;
      opts.timeout = gloo_timeout(timeout);
      wait(pg_->gather(outputs, inputs, opts), timeout);
    }
    for (std::size_t r = 0; r < out.size(); ++r) out[r].resize(static_cast<std::size_t>(sizes[r]));
    return out;
  }

  std::vector<std::string> do_all_gather(std::string bytes, Timeout timeout) override {
    std::vector<std::int64_t> sizes = all_gather_sizes(static_cast<std::int64_t>(bytes.size()), timeout);
    const std::int64_t max = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::string> out(world_size_, std::string(static_cast<std::size_t>(max), '\0'));
    if (max > 0) {
      bytes.resize(static_cast<std::size_t>(max));
      all_gather_tensors(byte_view(bytes), out, timeout);
    }
    for (std::size_t r = 0; r < out.size(); ++r) out[r].resize(static_cast<std::size_t>(sizes[r]));
    return out;
  }

  std::string do_scatter(std::vector<std::string> pieces, int root, Timeout timeout) override {
    // Root tells everyone every size, then scatters pieces padded to the largest.
    std::vector<std::int64_t> sizes(world_size_, 0);
    if (rank_ == root) {
      for (int r = 0; r < world_size_; ++r) sizes[r] = static_cast<std::int64_t>(pieces[r].size());
    }
    broadcast_tensor(int64_view(sizes.data(), sizes.size()), root, timeout);
    const std::int64_t max = *std::max_element(sizes.begin(), sizes.end());
    std::string mine(static_cast<std::size_t>(max), '\0');
    if (max > 0) {
      std::vector<at::Tensor> outputs{byte_view(mine)};
      std::vector<std::vector<at::Tensor>> inputs;
      if (rank_ == root) {
        inputs.emplace_back();
        for (auto& p : pieces) {
          p.resize(static_cast<std::size_t>(max));
          inputs.back().push_back(byte_view(p));
        }
      }
      c10d::ScatterOptions opts;
      opts.rootRank = root;
      opts.timeout = gloo_timeout(timeout);
      wait(pg_->scatter(outputs, inputs, opts), timeout);
    }
    mine.resize(static_cast<std::size_t>(sizes[rank_]));
    return mine;
  }

  std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp op, Timeout timeout) override {
    all_reduce_tensor(int64_view(&value, 1), op, timeout);
    return value;
  }

  double do_all_reduce_double(double value, ReduceOp op, Timeout timeout) override {
    all_reduce_tensor(at::from_blob(&value, {1}, at::TensorOptions(at::kDouble)), op, timeout);
    return value;
  }

 private:
  static void wait(const c10::intrusive_ptr<c10d::Work>& work, Timeout timeout) {
    try {
      if (timeout == kNoTimeout) {
        work->wait();
      } else {
        work->wait(timeout);
      }
    } catch (const c10::Error& e) {
      // Work::wait(timeout) gives only "Operation timed out!"; say what was waited for.
      const std::string what = e.what_without_backtrace();
      if (what.find("timed out") != std::string::npos) {
        throw CommError("timed out waiting for the other ranks to join (c10d: " + what + ")");
      }
      throw CommError(what);
    } catch (...) {
      rethrow_as_comm_error("");
    }
  }

  void broadcast_tensor(at::Tensor t, int root, Timeout timeout) {
    std::vector<at::Tensor> tensors{std::move(t)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = gloo_timeout(timeout);
    wait(pg_->broadcast(tensors, opts), timeout);
  }

  void all_reduce_tensor(at::Tensor t, ReduceOp op, Timeout timeout) {
    std::vector<at::Tensor> tensors{std::move(t)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = gloo_timeout(timeout);
    wait(pg_->allreduce(tensors, opts), timeout);
  }

  // REQUIRES: out.size() == world_size_, each out[r].size() == input's size.
  void all_gather_tensors(at::Tensor input, std::vector<std::string>& out, Timeout timeout) {
    std::vector<at::Tensor> inputs{std::move(input)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (auto& s : out) outputs[0].push_back(byte_view(s));
    c10d::AllgatherOptions opts;
    opts.timeout = gloo_timeout(timeout);
    wait(pg_->allgather(outputs, inputs, opts), timeout);
  }

  std::vector<std::int64_t> all_gather_sizes(std::int64_t mine, Timeout timeout) {
    std::vector<std::int64_t> sizes(world_size_, 0);
    std::vector<at::Tensor> inputs{int64_view(&mine, 1)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (auto& s : sizes) outputs[0].push_back(int64_view(&s, 1));
    c10d::AllgatherOptions opts;
    opts.timeout = gloo_timeout(timeout);
    wait(pg_->allgather(outputs, inputs, opts), timeout);
    return sizes;
  }

  const int rank_;
  const int world_size_;
  c10::intrusive_ptr<c10d::Store> store_;  // outlives pg_ (declared first, destroyed last)
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

using detail::env_int;

GlooOptions gloo_options_from_env(CommOptions comm) {
  GlooOptions o;
  o.comm = comm;
  constexpr long kMaxWorld = 1 << 20;
  auto world = env_int("WORLD_SIZE", 1, kMaxWorld);
  auto rank = env_int("RANK", 0, kMaxWorld - 1);
  if (!world || !rank) {
    throw UsageError(std::string("gloo: environment variable ") + (!rank ? "RANK" : "WORLD_SIZE") +
                     " is not set (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  }
  if (*rank >= *world) {
    throw UsageError(fmt::format("gloo: RANK={} is not below WORLD_SIZE={}", *rank, *world));
  }
  o.rank = static_cast<int>(*rank);
  o.world_size = static_cast<int>(*world);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') o.master_addr = addr;
  if (auto port = env_int("MASTER_PORT", 1, 65535)) o.master_port = static_cast<int>(*port);
  if (auto local = env_int("LOCAL_RANK", 0, kMaxWorld - 1)) o.local_rank = static_cast<int>(*local);
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr) o.interface = iface;
  return o;
}

std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw UsageError(fmt::format("gloo: invalid rank {} for world size {}", options.rank, options.world_size));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    throw UsageError(fmt::format("gloo: invalid master port {}", options.master_port));
  }
  // gloo writes to its peers' sockets without MSG_NOSIGNAL: when a peer dies, a write to its
  // closed socket would kill this process with SIGPIPE instead of failing the collective with
  // a CommError naming the dead rank. Ignore SIGPIPE unless the program installed a handler.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace shardpoint::comm
