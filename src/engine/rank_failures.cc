#include "engine/rank_failures.h"

#include <utility>

namespace shardpoint::engine {
namespace {

// The message part of an encoded error.
std::string message_of(const std::string& encoded) {
  const std::size_t nl = encoded.find('\n');
  return nl == std::string::npos ? encoded : encoded.substr(nl + 1);
}

}  // namespace

std::string combine_failures(std::string_view op, const std::vector<RankFailure>& failures, int world) {
  std::string ranks;
  for (const RankFailure& f : failures) ranks += (ranks.empty() ? "" : ", ") + std::to_string(f.rank);
  std::string message = std::string(op) + " failed on rank" + (failures.size() > 1 ? "s " : " ") + ranks + " (of " +
                        std::to_string(world) + ")";
  for (const RankFailure& f : failures)
    message +=
        (&f == &failures.front() ? ": rank " : "; rank ") + std::to_string(f.rank) + ": " + message_of(f.encoded);
  const std::string& first = failures.front().encoded;
  const std::size_t nl = first.find('\n');
  return (nl == std::string::npos ? std::string("error") : first.substr(0, nl)) + "\n" + message;
}

[[noreturn]] void throw_encoded(const std::string& encoded) { comm::throw_decoded_error(encoded, ""); }

std::string encode_current() { return comm::encode_error(std::current_exception()); }

void agree_or_throw(comm::Communicator& comm, std::exception_ptr local, std::string_view op) {
  std::vector<comm::RankError> errors = comm.all_errors(comm::encode_error(local));
  if (errors.empty()) return;
  std::vector<RankFailure> failures;
  failures.reserve(errors.size());
  for (auto& e : errors) failures.push_back({e.rank, std::move(e.message)});
  throw_encoded(combine_failures(op, failures, comm.world_size()));
}

}  // namespace shardpoint::engine
