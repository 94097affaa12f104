#include "shardpoint/communicator_from_env.h"

#include <cstdlib>
#include <string_view>

#include "comm/tcp_communicator.h"
#include "shardpoint/error.h"
#include "shardpoint/single_communicator.h"
#ifdef SP_HAVE_GLOO
#include "comm/gloo_communicator.h"
#endif
#ifdef SP_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

namespace shardpoint::comm {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

CommDriver comm_driver_from_env() {
  if (const char* chosen = std::getenv("SHARDPOINT_COMM"); chosen != nullptr && *chosen != '\0') {
    const std::string_view name(chosen);
    if (name == "single") return CommDriver::kSingle;
    if (name == "tcp") return CommDriver::kTcp;
    if (name == "gloo") return CommDriver::kGloo;
    if (name == "mpi") return CommDriver::kMpi;
    throw UsageError("environment variable SHARDPOINT_COMM=\"" + std::string(name) +
                     "\": expected single, tcp, gloo or mpi");
  }
  if (launched_by_mpirun()) return CommDriver::kMpi;
  if (std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr) {
    return comm_driver_available(CommDriver::kGloo) ? CommDriver::kGloo : CommDriver::kTcp;
  }
  return CommDriver::kSingle;
}

bool comm_driver_available(CommDriver driver) {
  switch (driver) {
    case CommDriver::kSingle: return true;
    case CommDriver::kTcp: return true;
#ifdef SP_HAVE_GLOO
    case CommDriver::kGloo: return true;
#endif
#ifdef SP_HAVE_MPI
    case CommDriver::kMpi: return true;
#endif
    default: return false;
  }
}

std::unique_ptr<Communicator> make_communicator_from_env(CommOptions options) {
  switch (comm_driver_from_env()) {
    case CommDriver::kMpi:
#ifdef SP_HAVE_MPI
      return make_mpi_communicator(options);
#else
      throw UsageError("the MPI driver was asked for (mpirun or SHARDPOINT_COMM=mpi), but this build has none "
                       "(OpenMPI not found at build time, or a program linked with sp_comm_env_tcp)");
#endif
    case CommDriver::kGloo:
#ifdef SP_HAVE_GLOO
      return make_gloo_communicator(gloo_options_from_env(options));
#else
      throw UsageError("SHARDPOINT_COMM=gloo, but this build has no Gloo driver (LibTorch not found at build "
                       "time, or a program linked with sp_comm_env_tcp); SHARDPOINT_COMM=tcp needs no LibTorch");
#endif
    case CommDriver::kTcp: return make_tcp_communicator(tcp_options_from_env(options));
    case CommDriver::kSingle: break;
  }
  return make_single_communicator(options);
}

}  // namespace shardpoint::comm
