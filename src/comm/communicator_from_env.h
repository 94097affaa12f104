// make_communicator_from_env(): the Communicator a program should use, chosen from how it was
// launched, so the same binary runs alone, under torchrun-style launchers and under mpirun:
//   1. under mpirun (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK set)  -> MPI driver
//   2. RANK and WORLD_SIZE set (torchrun; MASTER_ADDR/MASTER_PORT)     -> Gloo driver
//   3. otherwise                                                        -> single (world of 1)
//
// Lives in its own small library, sp_comm_env, which links whichever of sp_comm_gloo (LibTorch)
// and sp_comm_mpi (OpenMPI) were built; sp_comm itself depends on neither.
// Thread-safety: the functions read the environment; do not call setenv() concurrently.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace shardpoint::comm {

enum class CommDriver { kSingle, kGloo, kMpi };

// True when the environment says this process was started by mpirun.
bool launched_by_mpirun();

// The driver the environment asks for (rules above); does not check that it was built.
CommDriver comm_driver_from_env();

// Whether this build has the driver (sp_comm_gloo needs LibTorch, sp_comm_mpi needs MPI).
bool comm_driver_available(CommDriver driver);

// (all ranks) Creates the communicator chosen by comm_driver_from_env(); for Gloo and MPI it
// blocks until every rank has joined. Throws UsageError when the chosen driver is not built or
// the environment is invalid (e.g. RANK >= WORLD_SIZE), CommError when joining fails.
std::unique_ptr<Communicator> make_communicator_from_env(CommOptions options = {});

}  // namespace shardpoint::comm
