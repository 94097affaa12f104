// make_communicator_from_env(): the Communicator a program should use, chosen from how it was
// launched, so the same binary runs alone, under torchrun-style launchers and under mpirun:
//   0. SHARDPOINT_COMM=single|tcp|gloo|mpi                             -> that driver
//   1. under mpirun (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK set)  -> MPI driver
//   2. RANK and WORLD_SIZE set (torchrun; MASTER_ADDR/MASTER_PORT)     -> Gloo driver when
//      this build has it, else the TCP driver (same variables, no LibTorch)
//   3. otherwise                                                        -> single (world of 1)
//
// Two libraries build this file: sp_comm_env links whichever of sp_comm_gloo (LibTorch) and
// sp_comm_mpi (OpenMPI) were built; sp_comm_env_tcp links neither (single and TCP only), for
// programs that must not carry LibTorch's ~150 MiB of shared libraries in every rank
// (bench/dcp_bench). sp_comm itself (with the TCP driver) depends on neither.
// Thread-safety: the functions read the environment; do not call setenv() concurrently.
#pragma once

#include <memory>

#include "shardpoint/communicator.h"

namespace shardpoint::comm {

enum class CommDriver { kSingle, kGloo, kMpi, kTcp };

// True when the environment says this process was started by mpirun.
bool launched_by_mpirun();

// The driver the environment asks for (rules above); does not check that it was built.
// Throws UsageError when SHARDPOINT_COMM names no driver.
CommDriver comm_driver_from_env();

// Whether this build has the driver (sp_comm_gloo needs LibTorch, sp_comm_mpi needs MPI).
bool comm_driver_available(CommDriver driver);

// (all ranks) Creates the communicator chosen by comm_driver_from_env(); for TCP, Gloo and MPI
// it blocks until every rank has joined. Throws UsageError when the chosen driver is not built
// or the environment is invalid (e.g. RANK >= WORLD_SIZE), CommError when joining fails.
std::unique_ptr<Communicator> make_communicator_from_env(CommOptions options = {});

}  // namespace shardpoint::comm
