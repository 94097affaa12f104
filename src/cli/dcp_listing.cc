// CheckpointListing of a DCP checkpoint folder (filled in with the engine issue).
#include "cli/checkpoint_listing.h"
#include "core/error.h"

namespace shardpoint::cli {

std::unique_ptr<CheckpointListing> open_dcp_listing(const std::string& path) {
  throw UsageError(path + ": is a folder; DCP checkpoint folders are not supported by this build yet");
}

}  // namespace shardpoint::cli
