// SingleCommunicator: the world of one rank (rank 0 of 1). Every collective returns at once
// with this rank's own contribution: broadcast returns its bytes, gather and all_gather a vector
// of one element, scatter pieces[0], all_reduce the value itself. Used when a program runs
// without a launcher (no RANK/WORLD_SIZE, not under mpirun).
//
// Thread-safety: as Communicator (communicator.h).
#pragma once

#include <memory>

#include "shardpoint/communicator.h"

namespace shardpoint::comm {

// Never fails; timeouts are accepted and ignored since nothing waits.
std::unique_ptr<Communicator> make_single_communicator(CommOptions options = {});

}  // namespace shardpoint::comm
