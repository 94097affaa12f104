// One error from the failures of several ranks, for the collective steps of save() and
// load(): every rank learns of any rank's failure and throws the same error, of the lowest
// failed rank's category, naming every failed rank and its message
// ("save failed on ranks 1, 3 (of 4): rank 1: <message>; rank 3: <message>").
// Errors travel between ranks in comm::encode_error's form ("<category>\n<message>").
// Thread-safety: reentrant; agree_or_throw() is a collective (one call per communicator at
// a time).
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/communicator.h"

namespace shardpoint::engine {

struct RankFailure {
  int rank = 0;
  std::string encoded;  // comm::encode_error form: "<category>\n<message>"
};

// One encoded error (category of the lowest failed rank) whose message names every failed
// rank and its message: "save failed on rank 1 (of 4): rank 1: <message>".
// REQUIRES !failures.empty().
std::string combine_failures(std::string_view op, const std::vector<RankFailure>& failures, int world);

// Throws the error an encoded string describes (comm::throw_decoded_error).
[[noreturn]] void throw_encoded(const std::string& encoded);

// The exception being handled, encoded. Call only inside a catch block.
std::string encode_current();

// (all ranks) Throws the combined error (`op` names the operation) on every rank when any
// rank passes an error; returns when none does.
void agree_or_throw(comm::Communicator& comm, std::exception_ptr local, std::string_view op);

}  // namespace shardpoint::engine
