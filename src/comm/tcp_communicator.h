// TcpCommunicator: a Communicator over plain TCP sockets, with no dependency beyond the C++
// library and POSIX, for the processes that would otherwise link LibTorch only to reach Gloo
// (LibTorch's shared libraries alone add ~150 MiB to each rank's resident set).
//
// Topology: a star. Rank 0 listens at MASTER_ADDR:MASTER_PORT; every other rank connects to it
// once and keeps the connection. Every collective is one round: each rank sends rank 0 its
// contribution, rank 0 computes every rank's result and sends it back. The engine's
// collectives carry plans and metadata (kilobytes to a few MiB), where one round through rank
// 0 costs less than a ring's world-size rounds; tensors never travel through a Communicator.
//
// Wire: each message is a 24-byte header (magic "SPTC", kind, argument (root / reduce op),
// collective sequence number, payload length, little-endian) and the payload. Rank 0 checks
// that every rank called the same collective with the same root as the same collective of
// the sequence, so ranks calling different collectives get a CommError naming both
// (unlike Gloo, which may exchange garbage).
//
// Failures: a rank whose connection closes (it exited or crashed) or that does not take part
// before the timeout makes rank 0 fail the collective; rank 0 then tells every other rank
// why ("rank 3 closed its connection"), so all ranks fail within milliseconds of a death and
// the message names the rank that vanished. When rank 0 itself vanishes the others see their
// connection close. Joining waits at most `init_timeout`; ranks that start before rank 0
// listens retry the connection until then.
//
// Security: none (as Gloo and TCPStore): any process that can reach the port can join as a
// rank. Use on a trusted network or loopback; rank 0 binds MASTER_ADDR itself when that
// address is local (127.0.0.1 stays on loopback), else every interface.
//
// Thread-safety: as Communicator (communicator.h).
#pragma once

#include <memory>
#include <string>

#include "shardpoint/communicator.h"

namespace shardpoint::comm {

struct TcpOptions {
  CommOptions comm;
  int rank = 0;
  int world_size = 1;
  // Rank 0's address (a host name or a numeric IPv4/IPv6 address) and port.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Bound on joining: rank 0 waits this long for every rank, the others for rank 0.
  Timeout init_timeout = std::chrono::seconds(300);
};

// Reads torchrun's environment: RANK, WORLD_SIZE (required), MASTER_ADDR (default 127.0.0.1),
// MASTER_PORT (default 29500); init_timeout = comm.timeout (joining waits as long as a
// collective). Throws UsageError naming the variable when one is missing or
// not a valid number / in range.
TcpOptions tcp_options_from_env(CommOptions comm = {});

// (all ranks) Joins the group: returns once every rank has connected to rank 0 (at most
// init_timeout). Throws CommError naming the rank, the master address and the cause (port in
// use on rank 0, rank 0 unreachable, a rank with another world size, timeout); UsageError for
// invalid options.
std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options);

}  // namespace shardpoint::comm
