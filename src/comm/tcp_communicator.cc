#include "comm/tcp_communicator.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "comm/env_int.h"
#include "comm/tcp_wire.h"
#include "core/byte_io.h"
#include "shardpoint/error.h"

namespace shardpoint::comm {

namespace {

using tcp_wire::decode_double;
using tcp_wire::decode_header;
using tcp_wire::decode_i64;
using tcp_wire::decode_strings;
using tcp_wire::describe_collective;
using tcp_wire::encode_double;
using tcp_wire::encode_header;
using tcp_wire::encode_i64;
using tcp_wire::encode_strings;
using tcp_wire::Header;
using tcp_wire::kHeaderBytes;
using tcp_wire::Kind;
using tcp_wire::kind_name;
using Clock = std::chrono::steady_clock;

// A stray connection must say who it is within this long, or rank 0 drops it.
constexpr Timeout kHelloTimeout = std::chrono::seconds(10);

Clock::time_point deadline_after(Timeout t) { return t == kNoTimeout ? Clock::time_point::max() : Clock::now() + t; }

// Milliseconds poll() may wait before `deadline` (-1: for ever), at least 0.
int poll_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

// A connected, non-blocking socket; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Why talking to a peer failed; `who` names it ("rank 3").
struct PeerLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct PeerTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw CommError(fmt::format("fcntl(O_NONBLOCK): {}", std::strerror(errno)));
  }
}

void tune(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small messages, one round each
  set_nonblocking(fd);
}

// Sends all of data before the deadline. Throws PeerLost / PeerTimeout naming `who`.
void send_all(int fd, std::string_view data, Clock::time_point deadline, const std::string& who) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      throw PeerLost(fmt::format("{} closed its connection ({}): it exited or crashed", who, std::strerror(errno)));
    }
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, poll_ms(deadline));
    if (ready < 0 && errno != EINTR) throw CommError(fmt::format("poll: {}", std::strerror(errno)));
    if (ready == 0 && Clock::now() >= deadline) throw PeerTimeout(fmt::format("timed out sending to {}", who));
  }
}

// One message being received, possibly across many reads.
class Inbox {
 public:
  bool done() const { return header_ && payload_fill_ == payload_.size(); }
  const Header& header() const { return *header_; }
  std::string take_payload() { return std::move(payload_); }

  // Reads what the socket has. Returns false when the peer closed the connection.
  // Throws CommError when the bytes are not a message of ours.
  bool read_some(int fd, const std::string& who) {
    while (!done()) {
      char* dst;
      std::size_t want;
      if (!header_) {
        dst = head_ + head_fill_;
        want = kHeaderBytes - head_fill_;
      } else {
        dst = payload_.data() + payload_fill_;
        want = payload_.size() - payload_fill_;
      }
      const ssize_t n = ::recv(fd, dst, want, 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        return false;  // ECONNRESET and friends: the peer is gone
      }
      if (!header_) {
        head_fill_ += static_cast<std::size_t>(n);
        if (head_fill_ == kHeaderBytes) start_payload(who);
      } else {
        payload_fill_ += static_cast<std::size_t>(n);
      }
    }
    return true;
  }

 private:
  void start_payload(const std::string& who) {
    header_ = decode_header(reinterpret_cast<const std::byte*>(head_));
    if (!header_) throw CommError(fmt::format("{} sent bytes that are not a shardpoint tcp message", who));
    payload_.resize(static_cast<std::size_t>(header_->length));
  }

  char head_[kHeaderBytes] = {};
  std::size_t head_fill_ = 0;
  std::optional<Header> header_;
  std::string payload_;
  std::size_t payload_fill_ = 0;
};

struct Message {
  Header header;
  std::string payload;
};

// Receives one message from fd before the deadline.
Message receive_one(int fd, Clock::time_point deadline, const std::string& who) {
  Inbox in;
  while (true) {
    if (!in.read_some(fd, who)) throw PeerLost(fmt::format("{} closed its connection: it exited or crashed", who));
    if (in.done()) return {in.header(), in.take_payload()};
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_ms(deadline));
    if (ready < 0 && errno != EINTR) throw CommError(fmt::format("poll: {}", std::strerror(errno)));
    if (ready == 0 && Clock::now() >= deadline) throw PeerTimeout(fmt::format("timed out waiting for {}", who));
  }
}

void send_message(int fd, const Header& h, std::string_view payload, Clock::time_point deadline,
                  const std::string& who) {
  Header with_length = h;
  with_length.length = payload.size();
  send_all(fd, encode_header(with_length), deadline, who);
  send_all(fd, payload, deadline, who);
}

std::string rank_name(int r) { return r == 0 ? "rank 0 (the coordinator)" : fmt::format("rank {}", r); }

std::string ranks_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// getaddrinfo for a TCP stream to host:port. Throws CommError naming them.
struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
std::unique_ptr<addrinfo, AddrInfoDeleter> resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &out); rc != 0) {
    throw CommError(fmt::format("cannot resolve {}:{}: {}", host, port, ::gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(out);
}

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(const TcpOptions& o)
      : Communicator(o.comm), rank_(o.rank), world_size_(o.world_size), peers_(o.world_size) {
    const std::string where =
        fmt::format("tcp rank {}/{}: joining the group at {}:{}: ", o.rank, o.world_size, o.master_addr, o.master_port);
    try {
      if (world_size_ == 1) return;
      const auto deadline = deadline_after(o.init_timeout);
      if (rank_ == 0) {
        accept_ranks(o, deadline);
      } else {
        connect_to_coordinator(o, deadline);
      }
    } catch (const std::exception& e) {
      throw CommError(where + e.what());
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view name() const override { return "tcp"; }

 protected:
  void do_barrier(Timeout timeout) override {
    exchange(Kind::kBarrier, 0, {}, timeout, [&](std::vector<std::string>&) { return std::vector<std::string>(1); });
  }

  std::string do_broadcast(std::string bytes, int root, Timeout timeout) override {
    if (rank_ != root) bytes.clear();
    return exchange(Kind::kBroadcast, root, std::move(bytes), timeout, [&](std::vector<std::string>& in) {
      return std::vector<std::string>{std::move(in[static_cast<std::size_t>(root)])};
    });
  }

  std::vector<std::string> do_gather(std::string bytes, int root, Timeout timeout) override {
    std::string mine = exchange(Kind::kGather, root, std::move(bytes), timeout, [&](std::vector<std::string>& in) {
      std::vector<std::string> out(static_cast<std::size_t>(world_size_));
      out[static_cast<std::size_t>(root)] = encode_strings(in);
      return out;
    });
    return rank_ == root ? decode_strings(mine) : std::vector<std::string>{};
  }

  std::vector<std::string> do_all_gather(std::string bytes, Timeout timeout) override {
    return decode_strings(exchange(Kind::kAllGather, 0, std::move(bytes), timeout, [&](std::vector<std::string>& in) {
      return std::vector<std::string>{encode_strings(in)};
    }));
  }

  std::string do_scatter(std::vector<std::string> pieces, int root, Timeout timeout) override {
    std::string mine = rank_ == root ? encode_strings(pieces) : std::string();
    return exchange(Kind::kScatter, root, std::move(mine), timeout, [&](std::vector<std::string>& in) {
      std::vector<std::string> out = decode_strings(in[static_cast<std::size_t>(root)]);
      if (static_cast<int>(out.size()) != world_size_) {
        throw CommError(fmt::format("scatter: root sent {} pieces for {} ranks", out.size(), world_size_));
      }
      return out;
    });
  }

  std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp op, Timeout timeout) override {
    return decode_i64(exchange(Kind::kAllReduceInt, static_cast<std::uint16_t>(op), encode_i64(value), timeout,
                               [&](std::vector<std::string>& in) {
                                 std::int64_t acc = decode_i64(in[0]);
                                 for (std::size_t r = 1; r < in.size(); ++r)
                                   acc = reduce_values(acc, decode_i64(in[r]), op);
                                 return std::vector<std::string>{encode_i64(acc)};
                               }));
  }

  double do_all_reduce_double(double value, ReduceOp op, Timeout timeout) override {
    return decode_double(exchange(Kind::kAllReduceDouble, static_cast<std::uint16_t>(op), encode_double(value), timeout,
                                  [&](std::vector<std::string>& in) {
                                    double acc = decode_double(in[0]);
                                    for (std::size_t r = 1; r < in.size(); ++r) {
                                      acc = reduce_values(acc, decode_double(in[r]), op);
                                    }
                                    return std::vector<std::string>{encode_double(acc)};
                                  }));
  }

 private:
  using Combine = std::function<std::vector<std::string>(std::vector<std::string>&)>;

  // One collective round: every rank's `mine` goes to rank 0, which computes each rank's
  // result with `combine` (indexed by rank, or one result for every rank, so that rank 0
  // does not copy it world-size times) and sends it back. Returns this rank's result.
  std::string exchange(Kind kind, int arg, std::string mine, Timeout timeout, const Combine& combine) {
    const Header header{kind, static_cast<std::uint16_t>(arg), ++seq_, 0};
    const auto deadline = deadline_after(timeout);
    if (rank_ != 0) return exchange_as_member(header, mine, deadline);
    std::vector<std::string> in(static_cast<std::size_t>(world_size_));
    in[0] = std::move(mine);
    std::vector<std::string> out;
    try {
      receive_contributions(header, in, deadline);
      out = combine(in);
    } catch (const std::exception& e) {
      tell_everyone_it_failed(e.what());
      throw;
    }
    // Every rank gets its answer even when one of them has gone; then the first loss is reported.
    std::exception_ptr lost;
    for (int r = 1; r < world_size_; ++r) {
      try {
        send_message(peers_[r].get(), header, out[out.size() == 1 ? 0 : static_cast<std::size_t>(r)], deadline,
                     rank_name(r));
      } catch (...) {
        if (!lost) lost = std::current_exception();
      }
    }
    if (lost) std::rethrow_exception(lost);
    return std::move(out[0]);
  }

  std::string exchange_as_member(const Header& header, std::string_view mine, Clock::time_point deadline) {
    const int fd = peers_[0].get();
    const std::string who = rank_name(0);
    send_message(fd, header, mine, deadline, who);
    Message reply = receive_one(fd, deadline, who);
    if (reply.header.kind == Kind::kError) throw CommError("rank 0 reports: " + reply.payload);
    if (reply.header.kind != header.kind || reply.header.seq != header.seq) {
      throw CommError(fmt::format("rank 0 answered {} to this rank's {}",
                                  describe_collective(reply.header.kind, reply.header.arg, reply.header.seq),
                                  describe_collective(header.kind, header.arg, header.seq)));
    }
    return std::move(reply.payload);
  }

  // Rank 0: reads every other rank's message of this collective, whichever comes first.
  void receive_contributions(const Header& expected, std::vector<std::string>& in, Clock::time_point deadline) {
    std::vector<Inbox> inbox(static_cast<std::size_t>(world_size_));
    std::vector<int> waiting;
    for (int r = 1; r < world_size_; ++r) waiting.push_back(r);
    while (!waiting.empty()) {
      std::vector<pollfd> fds;
      for (int r : waiting) fds.push_back({peers_[r].get(), POLLIN, 0});
      const int ready = ::poll(fds.data(), fds.size(), poll_ms(deadline));
      if (ready < 0 && errno != EINTR) throw CommError(fmt::format("poll: {}", std::strerror(errno)));
      if (ready == 0 && Clock::now() >= deadline) {
        throw PeerTimeout(fmt::format("timed out waiting for rank{} {} to call {}", waiting.size() > 1 ? "s" : "",
                                      ranks_list(waiting),
                                      describe_collective(expected.kind, expected.arg, expected.seq)));
      }
      std::vector<int> still;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        const int r = waiting[i];
        Inbox& box = inbox[static_cast<std::size_t>(r)];
        if (fds[i].revents != 0 && !box.read_some(fds[i].fd, rank_name(r))) {
          throw PeerLost(fmt::format("rank {} closed its connection during {}: it exited or crashed", r,
                                     describe_collective(expected.kind, expected.arg, expected.seq)));
        }
        if (!box.done()) {
          still.push_back(r);
          continue;
        }
        const Header& h = box.header();
        if (h.kind != expected.kind || h.arg != expected.arg || h.seq != expected.seq) {
          throw CommError(fmt::format("rank {} called {} while rank 0 called {} (ranks must call the same "
                                      "collectives in the same order)",
                                      r, describe_collective(h.kind, h.arg, h.seq),
                                      describe_collective(expected.kind, expected.arg, expected.seq)));
        }
        in[static_cast<std::size_t>(r)] = box.take_payload();
      }
      waiting = std::move(still);
    }
  }

  // Rank 0, after a failed collective: every rank still connected learns why (best effort,
  // briefly: a rank that is itself stuck must not hold the others).
  void tell_everyone_it_failed(const std::string& why) noexcept {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    for (int r = 1; r < world_size_; ++r) {
      try {
        send_message(peers_[r].get(), Header{Kind::kError, 0, seq_, 0}, why, deadline, rank_name(r));
      } catch (...) {
      }
    }
  }

  // --- joining ---

  void accept_ranks(const TcpOptions& o, Clock::time_point deadline) {
    Socket listener = listen_on(o);
    int joined = 1;
    while (joined < world_size_) {
      pollfd p{listener.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, poll_ms(deadline));
      if (ready < 0 && errno != EINTR) throw CommError(fmt::format("poll: {}", std::strerror(errno)));
      if (ready == 0 && Clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 1; r < world_size_; ++r) {
          if (!peers_[r].valid()) missing.push_back(r);
        }
        throw CommError(fmt::format("timed out after {} waiting for rank{} {} to connect",
                                    describe_timeout(o.init_timeout), missing.size() > 1 ? "s" : "",
                                    ranks_list(missing)));
      }
      if (ready <= 0) continue;
      Socket conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) continue;  // the client gave up already; keep listening
      tune(conn.get());
      std::optional<int> r = read_hello(conn.get(), std::min(deadline, Clock::now() + kHelloTimeout));
      if (!r) continue;  // not one of ours: drop it
      peers_[*r] = std::move(conn);
      ++joined;
    }
    // Everyone is here: the answer to the hello releases the ranks (joining is a barrier).
    for (int r = 1; r < world_size_; ++r)
      send_message(peers_[r].get(), Header{Kind::kHello, 0, 0, 0}, {}, deadline, rank_name(r));
  }

  Socket listen_on(const TcpOptions& o) {
    // Bind MASTER_ADDR itself when it is one of this host's addresses, else every interface.
    for (bool any : {false, true}) {
      auto addrs = resolve(any ? std::string() : o.master_addr, o.master_port, any);
      int last_error = 0;
      for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) continue;
        int one = 1;
        (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), world_size_ + 16) == 0) return s;
        last_error = errno;
        if (last_error == EADDRINUSE) {
          throw CommError(fmt::format("rank 0 cannot listen on port {}: {}", o.master_port, std::strerror(last_error)));
        }
      }
      if (any) {
        throw CommError(fmt::format("rank 0 cannot listen on port {}: {}", o.master_port,
                                    last_error ? std::strerror(last_error) : "no usable address"));
      }
    }
    throw CommError("unreachable");
  }

  // Rank 0: the hello of a new connection. nullopt for a connection that is not a shardpoint
  // rank (wrong magic, silent, closed); throws for a rank of another job shape.
  std::optional<int> read_hello(int fd, Clock::time_point deadline) {
    Message m;
    try {
      m = receive_one(fd, deadline, "a connecting process");
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (m.header.kind != Kind::kHello || m.payload.size() != 8) return std::nullopt;
    const auto* p = as_bytes(m.payload).data();
    const int r = static_cast<int>(get_le<std::uint32_t>(p));
    const int world = static_cast<int>(get_le<std::uint32_t>(p + 4));
    std::string problem;
    if (world != world_size_) {
      problem = fmt::format("rank {} says WORLD_SIZE={}, rank 0 has WORLD_SIZE={}", r, world, world_size_);
    } else if (r <= 0 || r >= world_size_) {
      problem = fmt::format("a process joined as rank {}, outside [1, {})", r, world_size_);
    } else if (peers_[r].valid()) {
      problem = fmt::format("two processes joined as rank {}", r);
    }
    if (!problem.empty()) {
      try {
        send_message(fd, Header{Kind::kError, 0, 0, 0}, problem, Clock::now() + std::chrono::seconds(1), "");
      } catch (...) {
      }
      throw CommError(problem);
    }
    return r;
  }

  void connect_to_coordinator(const TcpOptions& o, Clock::time_point deadline) {
    auto backoff = std::chrono::milliseconds(10);
    std::string last = "not tried";
    while (true) {
      if (Socket s = try_connect(o, last); s.valid()) {
        peers_[0] = std::move(s);
        break;
      }
      if (Clock::now() + backoff >= deadline) {
        throw CommError(fmt::format("rank 0 not reachable within {} ({})", describe_timeout(o.init_timeout), last));
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    tune(peers_[0].get());
    std::string hello;
    put_le<std::uint32_t>(hello, static_cast<std::uint32_t>(rank_));
    put_le<std::uint32_t>(hello, static_cast<std::uint32_t>(world_size_));
    const std::string who = rank_name(0);
    send_message(peers_[0].get(), Header{Kind::kHello, 0, 0, 0}, hello, deadline, who);
    Message answer;
    try {
      answer = receive_one(peers_[0].get(), deadline, who);
    } catch (const PeerTimeout&) {
      throw CommError(fmt::format("connected, but not every rank joined within {}", describe_timeout(o.init_timeout)));
    }
    if (answer.header.kind == Kind::kError) throw CommError("rank 0 refused this rank: " + answer.payload);
    if (answer.header.kind != Kind::kHello) throw CommError("rank 0 answered the join with something else");
  }

  // One blocking connect attempt to rank 0; an invalid Socket (and `error`) when refused.
  static Socket try_connect(const TcpOptions& o, std::string& error) {
    auto addrs = resolve(o.master_addr, o.master_port, false);
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!s.valid()) continue;
      int rc;
      do {
        rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
      } while (rc != 0 && errno == EINTR);
      if (rc == 0) return s;
      error = std::strerror(errno);
    }
    return Socket();
  }

  const int rank_;
  const int world_size_;
  // Rank 0: peers_[r] is rank r's connection (peers_[0] unused). Others: peers_[0] only.
  std::vector<Socket> peers_;
  std::uint64_t seq_ = 0;  // collectives called so far (guarded by the base class mutex)
};

}  // namespace

using detail::env_int;

TcpOptions tcp_options_from_env(CommOptions comm) {
  TcpOptions o;
  o.comm = comm;
  // Joining is a barrier: it waits as long as any collective would (kNoTimeout: for ever).
  o.init_timeout = comm.timeout == kNoTimeout ? std::chrono::hours(24 * 365) : comm.timeout;
  constexpr long kMaxWorld = 1 << 16;
  auto world = env_int("WORLD_SIZE", 1, kMaxWorld);
  auto rank = env_int("RANK", 0, kMaxWorld - 1);
  if (!world || !rank) {
    throw UsageError(std::string("tcp: environment variable ") + (!rank ? "RANK" : "WORLD_SIZE") +
                     " is not set (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  }
  if (*rank >= *world) throw UsageError(fmt::format("tcp: RANK={} is not below WORLD_SIZE={}", *rank, *world));
  o.rank = static_cast<int>(*rank);
  o.world_size = static_cast<int>(*world);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') o.master_addr = addr;
  if (auto port = env_int("MASTER_PORT", 1, 65535)) o.master_port = static_cast<int>(*port);
  return o;
}

std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options) {
  if (options.world_size < 1 || options.world_size > (1 << 16) || options.rank < 0 ||
      options.rank >= options.world_size) {
    throw UsageError(fmt::format("tcp: invalid rank {} for world size {}", options.rank, options.world_size));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    throw UsageError(fmt::format("tcp: invalid master port {}", options.master_port));
  }
  return std::make_unique<TcpCommunicator>(options);
}

}  // namespace shardpoint::comm
