// Kill points: named places in the save path where a test can have the whole job die with
// SIGKILL, to check that a crash at that moment loses nothing committed (the kill -9 matrix,
// tests/train/train_kill_test.cc; docs/durability.md).
//
// A point fires only when the environment variable SHARDPOINT_TEST_KILL_AT names it:
//   SHARDPOINT_TEST_KILL_AT=<point>[:<rank>][@<n>]
// <point> is a kill_point_name() below; <rank> limits it to the process whose RANK variable
// (torchrun's) equals it (default: any rank; a process without RANK is rank 0); <n> fires at
// the n-th time this process reaches the point (default 1). Firing sends SIGKILL to the
// caller's process group: with `shardpoint-train --devices N` that is the launcher and every
// rank, as when a scheduler kills a job. Without the variable a point costs one test of a
// value parsed at the first call.
// A malformed value is ignored with one warning on stderr (a test then fails loudly because
// nothing was killed).
//
// Lost permissions: SHARDPOINT_TEST_READ_ONLY_AT=<point>[:<rank>][@<n>] (same syntax) has the
// selected arrival remove the write bits of the file or folder SHARDPOINT_TEST_READ_ONLY_PATH
// names and return, so the save goes on and meets EACCES (in a process without
// CAP_DAC_OVERRIDE: root ignores permission bits). Both variables may be set at once.
//
// Thread-safety: kill_point() may be called from any thread.
#pragma once

#include <string_view>

namespace shardpoint {

// The points, in the order a save reaches them. Names are part of the test interface.
enum class KillPoint {
  kPlan,       // "plan": save planning (engine step 1), before anything is written
  kDataWrite,  // "data": a rank's first data file half written (engine step 3)
  kSidecar,    // "sidecar": before the checksum sidecar is written (engine step 5)
  kLoadIndex,  // "index": before the load index is written
  kMetadata,   // "metadata": before `.metadata` (the engine's commit marker) is written
  kMetaPt,     // "meta_pt": before the trainer writes meta.pt (its commit marker)
  kPublish,    // "publish": a committed folder written beside its target, not yet swapped in
               // (consolidate: its output file complete under its temporary name)
  kRemoveOld,  // "remove_old": the new folder swapped in, the replaced one not yet removed
};

// "plan", "data", ... as listed above.
std::string_view kill_point_name(KillPoint point);

// Dies with the whole process group (SIGKILL) when SHARDPOINT_TEST_KILL_AT selects this
// call; makes SHARDPOINT_TEST_READ_ONLY_PATH read-only when SHARDPOINT_TEST_READ_ONLY_AT
// selects it; returns otherwise. Never throws.
void kill_point(KillPoint point) noexcept;

}  // namespace shardpoint
