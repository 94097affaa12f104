// MpiCommunicator: a Communicator over MPI (OpenMPI 4.1 here), for jobs started by mpirun.
// It works on its own duplicate of MPI_COMM_WORLD, so it never mixes with the program's MPI
// messages, and sets MPI_ERRORS_RETURN on it, so MPI errors become CommError.
//
// Timeouts: MPI collectives cannot time out, so each collective is posted non-blocking
// (MPI_Ibarrier, MPI_Ibcast, MPI_Igatherv, MPI_Iallgatherv, MPI_Iscatterv, MPI_Iallreduce) and
// polled with MPI_Test until done or until the timeout, then CommError. A posted collective
// cannot be cancelled: after a timeout the communicator is broken, and its destructor skips
// MPI_Finalize (which could wait for the dead collective for ever); mpirun then ends the job.
// A rank that dies normally makes mpirun kill the whole job, so the others may not get to
// report a CommError.
//
// Sizes: one rank's payload and the sum of all payloads in a gather must each stay below 2 GiB
// (MPI counts are int); larger ones throw UsageError.
//
// Lifetime: the first MpiCommunicator calls MPI_Init_thread (MPI_THREAD_SERIALIZED) unless MPI
// is already initialized; the last one destroyed calls MPI_Finalize if it initialized MPI.
// Thread-safety: as Communicator (communicator.h).
#pragma once

#include <memory>

#include "shardpoint/communicator.h"

namespace shardpoint::comm {

// (all ranks) Initializes MPI if needed and duplicates MPI_COMM_WORLD (a collective). Blocks
// without a timeout (MPI_Init_thread and MPI_Comm_dup have none; mpirun starts every rank).
// Throws CommError when MPI cannot initialize or was already finalized in this process.
std::unique_ptr<Communicator> make_mpi_communicator(CommOptions options = {});

}  // namespace shardpoint::comm
