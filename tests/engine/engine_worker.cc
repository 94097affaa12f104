// engine_worker: one rank of a multi-process save/load test. The communicator comes from
// make_communicator_from_env() (Gloo under launch_ranks, MPI under mpirun).
//
//   engine_worker save DIR   saves the deterministic state of checkpoint_test_state.h for
//                            this rank and world size into the folder DIR
//   engine_worker load DIR   loads DIR into this rank's template and checks every value
//
// Exit codes: 0 ok, 1 a value differs, 2 an exception. Output lines start with "rank R: ".
#include <iostream>
#include <sstream>
#include <string>

#include "engine/checkpoint_test_state.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator_from_env.h"
#include "storage/local_storage.h"

namespace se = shardpoint::engine;

int main(int argc, char** argv) {
  int rank = -1;
  auto say = [&](const std::string& line) {
    std::ostringstream s;
    s << "rank " << rank << ": " << line << "\n";
    std::cout << s.str() << std::flush;
  };
  if (argc != 3) {
    std::cerr << "usage: engine_worker save|load DIR\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    auto comm = shardpoint::comm::make_communicator_from_env(shardpoint::comm::CommOptions{std::chrono::seconds(60)});
    rank = comm->rank();
    const int world = comm->world_size();
    auto st = shardpoint::storage::open_local_storage_at(argv[2]);
    if (mode == "save") {
      se::testing::RankState state = se::testing::make_rank_state(rank, world, true);
      se::SaveOptions options;
      options.durable = false;
      const se::SaveReport report = se::save(state.root, *st, *comm, options);
      say("saved " + std::to_string(report.bytes_written) + " bytes in " + std::to_string(report.files.size()) +
          " files");
      return 0;
    }
    if (mode == "load") {
      se::testing::RankState state = se::testing::make_rank_state(rank, world, false);
      const se::LoadReport report = se::load(state.root, *st, *comm);
      const std::string diff = se::testing::compare_with_expected(state, rank, world);
      if (!diff.empty()) {
        say("MISMATCH: " + diff);
        return 1;
      }
      say("loaded ok, needed " + std::to_string(report.bytes_needed) + " read " + std::to_string(report.bytes_read));
      return 0;
    }
    say("unknown mode " + mode);
    return 2;
  } catch (const std::exception& e) {
    say(std::string("exception: ") + e.what());
    return 2;
  }
}
