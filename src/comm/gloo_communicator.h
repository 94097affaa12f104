// GlooCommunicator: a Communicator over LibTorch's c10d ProcessGroupGloo, with a c10d TCPStore
// for rendezvous (rank 0 runs the store server at MASTER_ADDR:MASTER_PORT), as torchrun and
// torch.distributed.init_process_group("gloo") do. CPU only; byte payloads travel as uint8
// tensors (variable sizes: the sizes are exchanged first and buffers padded to the largest).
//
// This driver is the only part of comm/ that links LibTorch: it lives in its own library,
// sp_comm_gloo, built only when find_package(Torch) succeeds. This header includes no Torch.
//
// Timeouts: each collective waits for its c10d Work at most `timeout`; gloo itself aborts an
// operation after the process group's timeout (CommOptions::timeout, set at creation). A dead
// peer closes its sockets, so the other ranks usually fail within milliseconds, not at the
// timeout. Gloo cannot detect ranks that call different collectives: they may hang until the
// timeout or exchange garbage (the ThreadGroup driver does detect it, so test there).
// After a timeout the destructor may block until gloo's own timeout ends the stuck operation.
// make_gloo_communicator() sets SIGPIPE to ignored when it is at its default (gloo's socket
// writes would otherwise let a dying peer kill this process).
//
// Thread-safety: as Communicator (communicator.h).
#pragma once

#include <memory>
#include <string>

#include "shardpoint/communicator.h"

namespace shardpoint::comm {

struct GlooOptions {
  CommOptions comm;
  int rank = 0;
  int world_size = 1;
  // Where rank 0's TCPStore listens (it binds MASTER_PORT on all interfaces).
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // LOCAL_RANK as torchrun sets it; -1 when not given. Informational (device choice upstream).
  int local_rank = -1;
  // Bound on rendezvous: connecting to the store, all ranks joining, gloo's full-mesh connect.
  Timeout init_timeout = std::chrono::seconds(300);
  // Network interface gloo binds (GLOO_SOCKET_IFNAME, e.g. "lo", "eth0"). When empty, gloo binds
  // 127.0.0.1 if master_addr is a loopback address, else the address this host's name resolves to.
  std::string interface;
};

// Reads torchrun's environment: RANK, WORLD_SIZE (required), MASTER_ADDR (default 127.0.0.1),
// MASTER_PORT (default 29500), LOCAL_RANK (optional), GLOO_SOCKET_IFNAME (optional).
// Throws UsageError naming the variable when one is missing or not a valid number / in range.
GlooOptions gloo_options_from_env(CommOptions comm = {});

// (all ranks) Joins the group: blocks until every rank has connected (at most init_timeout).
// Throws CommError naming rank, master address and the cause (port in use on rank 0,
// unreachable store, timeout). Throws UsageError for invalid options.
std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options);

}  // namespace shardpoint::comm
