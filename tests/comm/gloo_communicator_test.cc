// Gloo driver across real processes: comm_worker started as N ranks by launch_ranks (RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), as torchrun would: the cases every driver
// passes (multi_process_cases.cc).
#include <gtest/gtest.h>

#include "multi_process_cases.h"

namespace shardpoint::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Gloo, MultiProcessCommTest,
                         ::testing::Values(CommDriverUnderTest{.name = "gloo", .worker = SP_COMM_WORKER}),
                         CommDriverName());

}  // namespace
}  // namespace shardpoint::testing
