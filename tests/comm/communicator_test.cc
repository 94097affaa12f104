// Communicator base class: timeout text, reductions, and the error wire form used by
// rethrow_if_any_failed (the collectives themselves are tested per driver).
#include "shardpoint/communicator.h"

#include <gtest/gtest.h>

#include "comm/shared_error.h"
#include "shardpoint/error.h"

namespace shardpoint::comm {
namespace {

TEST(CommunicatorTest, DescribeTimeout) {
  EXPECT_EQ(describe_timeout(std::chrono::seconds(300)), "300 s");
  EXPECT_EQ(describe_timeout(std::chrono::milliseconds(1500)), "1.50 s");
  EXPECT_EQ(describe_timeout(kNoTimeout), "no timeout");
  EXPECT_EQ(CommOptions{}.timeout, std::chrono::seconds(300));
}

TEST(CommunicatorTest, ReduceValues) {
  EXPECT_EQ(reduce_values(std::int64_t{3}, std::int64_t{-4}, ReduceOp::kSum), -1);
  EXPECT_EQ(reduce_values(std::int64_t{3}, std::int64_t{-4}, ReduceOp::kMin), -4);
  EXPECT_EQ(reduce_values(std::int64_t{3}, std::int64_t{-4}, ReduceOp::kMax), 3);
  EXPECT_DOUBLE_EQ(reduce_values(1.5, 2.25, ReduceOp::kSum), 3.75);
  EXPECT_DOUBLE_EQ(reduce_values(1.5, 2.25, ReduceOp::kMin), 1.5);
  EXPECT_DOUBLE_EQ(reduce_values(1.5, 2.25, ReduceOp::kMax), 2.25);
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMax), "max");
}

TEST(CommunicatorTest, EncodeNothingIsEmpty) { EXPECT_EQ(encode_error(nullptr), ""); }

// Decodes what encode_error made of `original` and returns the rethrown exception.
std::exception_ptr round_trip(std::exception_ptr original) {
  const std::string wire = encode_error(original);
  EXPECT_FALSE(wire.empty());
  try {
    throw_decoded_error(wire, "rank 3: ", " (and 1 more ranks failed)");
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

template <typename E>
void expect_round_trip(E original, const std::string& message) {
  std::exception_ptr back = round_trip(std::make_exception_ptr(original));
  try {
    std::rethrow_exception(back);
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), "rank 3: " + message + " (and 1 more ranks failed)");
    EXPECT_TRUE(is_shared_error(e)) << message;
  } catch (...) {
    ADD_FAILURE() << "wrong exception type for " << message;
  }
}

TEST(CommunicatorTest, ErrorCategoriesSurviveTheWire) {
  expect_round_trip(FormatError("bad\nzip header"), "bad\nzip header");
  expect_round_trip(PlanError("missing key w"), "missing key w");
  expect_round_trip(UsageError("bad url"), "bad url");
  expect_round_trip(CommError("timeout"), "timeout");
  expect_round_trip(Error("plain"), "plain");

  std::exception_ptr back = round_trip(std::make_exception_ptr(StorageError(StorageError::Kind::kTransient, "503")));
  try {
    std::rethrow_exception(back);
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient);
    EXPECT_TRUE(e.retryable());
    EXPECT_TRUE(is_shared_error(e));
  }
}

// Only decoded errors carry the mark: a rank's own failure, and a new exception made from
// a decoded one, do not.
TEST(CommunicatorTest, OnlyDecodedErrorsAreShared) {
  EXPECT_FALSE(is_shared_error(StorageError(StorageError::Kind::kNoSpace, "disk full")));
  EXPECT_FALSE(is_shared_error(std::runtime_error("own")));
  try {
    try {
      throw_decoded_error("storage:2\nwrite x: No space left on device", "");
    } catch (const StorageError&) {
      rethrow_with_context("save");
    }
  } catch (const StorageError& e) {
    EXPECT_EQ(std::string(e.what()), "save: write x: No space left on device");
    EXPECT_FALSE(is_shared_error(e));
  }
}

TEST(CommunicatorTest, ForeignExceptionsBecomeError) {
  std::exception_ptr back = round_trip(std::make_exception_ptr(std::runtime_error("std boom")));
  try {
    std::rethrow_exception(back);
  } catch (const CommError&) {
    ADD_FAILURE() << "should be a plain Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 3: std boom (and 1 more ranks failed)");
  }
  back = round_trip(std::make_exception_ptr(42));
  EXPECT_THROW(std::rethrow_exception(back), Error);
}

TEST(CommunicatorTest, HostileWireFormIsStillAnError) {
  EXPECT_THROW(throw_decoded_error("no newline", ""), Error);
  EXPECT_THROW(throw_decoded_error("storage:999\nx", ""), StorageError);
  EXPECT_THROW(throw_decoded_error("storage:\nx", ""), StorageError);
  EXPECT_THROW(throw_decoded_error("unknown-category\nx", ""), Error);
}

}  // namespace
}  // namespace shardpoint::comm
