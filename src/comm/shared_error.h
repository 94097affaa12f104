// Shared errors: the exceptions comm::throw_decoded_error raises carry a mark, so a process
// can tell a failure the ranks share from one of its own.
//
// Thread-safety: a pure function of its argument.
#pragma once

#include <exception>

namespace shardpoint::comm {

// True when throw_decoded_error raised `error`: a failure another rank reported, or one the
// ranks agreed on (rethrow_if_any_failed, the engine's collective steps). Every rank of the
// job raises it, so a launcher may report it once (shardpoint-train: on rank 0). A new
// exception made from it (rethrow_with_context) is not marked.
bool is_shared_error(const std::exception& error);

}  // namespace shardpoint::comm
