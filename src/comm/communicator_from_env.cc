#include "comm/communicator_from_env.h"

#include <cstdlib>

#include "comm/single_communicator.h"
#include "core/error.h"
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
  if (launched_by_mpirun()) return CommDriver::kMpi;
  if (std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr) return CommDriver::kGloo;
  return CommDriver::kSingle;
}

bool comm_driver_available(CommDriver driver) {
  switch (driver) {
    case CommDriver::kSingle: return true;
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
      throw UsageError("launched by mpirun, but this build has no MPI driver (OpenMPI not found at build time)");
#endif
    case CommDriver::kGloo:
#ifdef SP_HAVE_GLOO
      return make_gloo_communicator(gloo_options_from_env(options));
#else
      throw UsageError("RANK and WORLD_SIZE are set, but this build has no Gloo driver (LibTorch not found at build time)");
#endif
    case CommDriver::kSingle:
      break;
  }
  return make_single_communicator(options);
}

}  // namespace shardpoint::comm
