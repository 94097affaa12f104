// HttpClient's checks that need no server: what a 206 must answer to a ranged GET
// (check_range_answer), and how retry counts read (retry_stats.h).
#include "storage/http/http_client.h"

#include <gtest/gtest.h>

#include "storage/http/retry_stats.h"

namespace shardpoint::storage::http {
namespace {

TEST(CheckRangeAnswerTest, AcceptsTheAskedRangeAndTheTailOfAShorterObject) {
  EXPECT_EQ(check_range_answer({10, 100}, "bytes 10-109/1000", 100), "");
  EXPECT_EQ(check_range_answer({10, 100}, "bytes 10-109/*", 100), "");
  EXPECT_EQ(check_range_answer({0, 1}, "bytes 0-0/1", 1), "");
  // The object ends inside the range: the caller reports past-the-end, not a bad answer.
  EXPECT_EQ(check_range_answer({10, 100}, "bytes 10-49/50", 40), "");
  // Nothing of the range exists (Azurite's answer for an empty blob).
  EXPECT_EQ(check_range_answer({0, 1}, "bytes 0--1/0", 0), "");
  EXPECT_NE(check_range_answer({0, 1}, "bytes 0--1/0", 1), "");
}

TEST(CheckRangeAnswerTest, RejectsAnotherRangeOrBodyLength) {
  EXPECT_EQ(check_range_answer({10, 100}, "bytes 11-110/1000", 100),
            "206 for bytes 11-110 of 1000 (100 body bytes), asked for bytes 10-109");
  // Shorter than asked although the object is long enough.
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-59/1000", 50), "");
  // Shorter without a known total.
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-59/*", 50), "");
  // Header and body disagree.
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-109/1000", 99), "");
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-109/1000", 101), "");
  // Missing or malformed Content-Range.
  EXPECT_EQ(check_range_answer({10, 100}, "", 100), "206 without a byte Content-Range (\"\"), asked for bytes 10-109");
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-x/1000", 100), "");
  EXPECT_NE(check_range_answer({10, 100}, "bytes 109-10/1000", 100), "");
  EXPECT_NE(check_range_answer({10, 100}, "bytes 10-109", 100), "");
}

TEST(RetryStatsTest, CountsByCauseAndDescribesThem) {
  const RetryCounts before = retry_counts();
  count_retry(RetryCause::kThrottled);
  count_retry(RetryCause::kThrottled);
  count_retry(RetryCause::kMalformed);
  count_exhausted();
  const RetryCounts added = retry_counts_since(before, retry_counts());
  EXPECT_EQ(added.total(), 3u);
  EXPECT_EQ(added[RetryCause::kThrottled], 2u);
  EXPECT_EQ(describe_retry_counts(added),
            "http: 3 retries (2 throttled, 1 malformed response), 1 request out of retries");
  EXPECT_EQ(describe_retry_counts(RetryCounts{}), "http: 0 retries, 0 requests out of retries");
  RetryCounts damaged;
  damaged.retries[static_cast<std::size_t>(RetryCause::kBodyChecksum)] = 2;
  EXPECT_EQ(describe_retry_counts(damaged), "http: 2 retries (2 body checksum mismatch), 0 requests out of retries");
}

}  // namespace
}  // namespace shardpoint::storage::http
