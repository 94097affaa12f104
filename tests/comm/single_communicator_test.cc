#include "shardpoint/single_communicator.h"

#include <gtest/gtest.h>

#include "shardpoint/error.h"

namespace shardpoint::comm {
namespace {

TEST(SingleCommunicatorTest, EveryCollectiveReturnsOwnContribution) {
  auto comm = make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_TRUE(comm->is_coordinator());
  EXPECT_EQ(comm->name(), "single");
  comm->barrier();
  EXPECT_EQ(comm->broadcast(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(comm->gather("g"), std::vector<std::string>{"g"});
  EXPECT_EQ(comm->all_gather("x"), std::vector<std::string>{"x"});
  EXPECT_EQ(comm->scatter({"only"}), "only");
  EXPECT_EQ(comm->all_reduce(std::int64_t{-7}, ReduceOp::kSum), -7);
  EXPECT_DOUBLE_EQ(comm->all_reduce(2.5, ReduceOp::kMax), 2.5);
  EXPECT_TRUE(comm->all_ok(true));
  EXPECT_FALSE(comm->all_ok(false));
  EXPECT_TRUE(comm->all_errors("").empty());
  EXPECT_EQ(comm->all_errors("oops"), (std::vector<RankError>{{0, "oops"}}));
  comm->barrier(kNoTimeout);
}

TEST(SingleCommunicatorTest, RethrowIfAnyFailedRethrowsTheSameObject) {
  auto comm = make_single_communicator();
  comm->rethrow_if_any_failed(nullptr);
  auto local = std::make_exception_ptr(PlanError("no such key"));
  try {
    comm->rethrow_if_any_failed(local);
    FAIL() << "no throw";
  } catch (const PlanError& e) {
    EXPECT_STREQ(e.what(), "no such key");
  }
}

TEST(SingleCommunicatorTest, InvalidArgumentsAreUsageErrors) {
  auto comm = make_single_communicator();
  EXPECT_THROW(comm->broadcast("x", 1), UsageError);
  EXPECT_THROW(comm->gather("x", -1), UsageError);
  EXPECT_THROW(comm->scatter({"a", "b"}), UsageError);
  EXPECT_THROW(comm->scatter({}), UsageError);
  EXPECT_THROW(comm->barrier(std::chrono::milliseconds(-5)), UsageError);
  // Usage errors are caught before anything is sent: the communicator still works.
  EXPECT_EQ(comm->broadcast("ok"), "ok");
}

}  // namespace
}  // namespace shardpoint::comm
