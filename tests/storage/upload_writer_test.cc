// http::make_upload_writer, the writer of every object-store driver, over a PartUpload that
// records what it is asked (no server): one-part objects, parts in parallel with their
// offsets, the tail handed to finish(), a failed part, abandoned writers and failed commits;
// without overlap_fill, parts uploaded one at a time on the writer's thread from one buffer;
// append_borrowed(): parts of the caller's spans and the writer's copies, their digests, and
// no borrowed byte read after a failed call or the writer's destruction.
#include "storage/http/upload_writer.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/buffer_pool.h"
#include "core/checksum.h"
#include "shardpoint/error.h"
#include "storage_test_util.h"

namespace shardpoint::storage::http {
namespace {

using storage::testing::pattern;

constexpr std::size_t kPart = 4096;

// Records every call. put_part() of part `fail_part` throws; finish() throws when fail_finish.
class RecordingUpload final : public PartUpload {
 public:
  void put_whole(const PartBody& body, const IoOptions& io) override {
    std::lock_guard lock(mu_);
    whole = gathered(body);
    whole_body = {body.pieces.size(), body.sha256_hex, body.crc32c, body.md5};
    whole_calls++;
  }
  void start(const IoOptions& io) override { starts++; }
  void put_part(std::size_t index, std::uint64_t offset, const PartBody& body, const IoOptions& io) override {
    {
      std::lock_guard lock(mu_);
      for (ByteSpan piece : body.pieces) {
        if (caller_bytes.data() <= piece.data() && piece.data() < caller_bytes.data() + caller_bytes.size()) {
          borrowed_bytes += piece.size();
        }
      }
      part_threads.insert(std::this_thread::get_id());
      if (pool != nullptr) leased_during_part.push_back(pool->leased_buffers());
    }
    int now = ++in_flight_;
    for (int seen = max_in_flight.load(); now > seen && !max_in_flight.compare_exchange_weak(seen, now);) {
    }
    if (wait_for_company) {
      // Held until a second part is in flight too (10 s at most, once, so a serial writer
      // fails the test instead of hanging it): parallel parts show on any machine load.
      std::unique_lock lock(mu_);
      company_.notify_all();
      if (!company_wait_over_) {
        company_.wait_for(lock, std::chrono::seconds(10), [&] { return max_in_flight.load() >= 2; });
        company_wait_over_ = true;
      }
    } else if (part_delay.count() > 0) {
      std::this_thread::sleep_for(part_delay);
    } else {
      std::this_thread::yield();  // lets other parts start while this one is "uploading"
    }
    // Read the body as a request would, after the wait: a borrowed piece must still be valid.
    std::string bytes = gathered(body);
    --in_flight_;
    if (static_cast<int>(index) == fail_part) throw StorageError(StorageError::Kind::kTransient, "part failed");
    std::lock_guard lock(mu_);
    parts[index] = {offset, std::move(bytes)};
    bodies[index] = {body.pieces.size(), body.sha256_hex, body.crc32c, body.md5};
  }
  void finish(std::size_t count, std::uint64_t size, const PartBody& last, const IoOptions& io) override {
    if (fail_finish) throw StorageError(StorageError::Kind::kOther, "finish failed");
    finished_parts = count;
    finished_size = size;
    tail = gathered(last);
  }

  static std::string gathered(const PartBody& body) {
    std::string out;
    for (ByteSpan piece : body.pieces) out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    EXPECT_EQ(out.size(), body.size);
    return out;
  }
  void abort() override { aborts++; }

  // The parts in index order (checking each starts where the previous ended), then the tail.
  std::string assembled() const {
    std::string out;
    for (const auto& [index, part] : parts) {
      EXPECT_EQ(part.first, out.size()) << "part " << index;
      out += part.second;
    }
    return out + tail;
  }

  int in_flight() const { return in_flight_.load(); }

  // What a body carried besides its bytes.
  struct BodyFacts {
    std::size_t pieces = 0;
    std::string sha256_hex;
    std::optional<std::uint32_t> crc32c;
    std::optional<std::array<std::uint8_t, 16>> md5;
  };

  int fail_part = -1;
  std::chrono::milliseconds part_delay{0};  // put_part() sleeps this long before reading its body
  ByteSpan caller_bytes;                    // pieces inside it count as borrowed_bytes
  std::size_t borrowed_bytes = 0;
  std::map<std::size_t, BodyFacts> bodies;
  BodyFacts whole_body;
  bool fail_finish = false;
  const BufferPool* pool = nullptr;  // when set, its leased buffers are recorded per part
  bool wait_for_company = false;     // put_part() waits for another part to be in flight
  std::string whole;
  int whole_calls = 0;
  std::atomic<int> starts{0};
  std::atomic<int> aborts{0};
  std::atomic<int> max_in_flight{0};
  std::map<std::size_t, std::pair<std::uint64_t, std::string>> parts;
  std::size_t finished_parts = 0;
  std::uint64_t finished_size = 0;
  std::string tail;
  std::set<std::thread::id> part_threads;       // the threads put_part() ran on
  std::vector<std::size_t> leased_during_part;  // pool->leased_buffers() as each part began

 private:
  std::mutex mu_;
  std::condition_variable company_;  // a part started (with mu_)
  bool company_wait_over_ = false;   // GUARDED_BY(mu_)
  std::atomic<int> in_flight_{0};
};

std::shared_ptr<BufferPool> small_pool(std::size_t buffers) {
  BufferPoolOptions options;
  options.buffer_bytes = kPart;
  options.capacity_bytes = buffers * kPart;
  options.huge_pages = false;
  return std::make_shared<BufferPool>(options);
}

std::unique_ptr<StorageWriter> writer_for(std::shared_ptr<RecordingUpload> upload, std::shared_ptr<BufferPool> pool,
                                          int parts_in_flight, bool tail_in_finish, bool overlap_fill = true) {
  UploadLimits limits;
  limits.part_bytes = kPart;
  limits.parts_in_flight = parts_in_flight;
  limits.tail_in_finish = tail_in_finish;
  limits.overlap_fill = overlap_fill;
  return make_upload_writer("k", "test object \"t://k\"", std::move(upload), std::move(pool), limits);
}

void append_in_pieces(StorageWriter& w, const std::string& data, std::size_t piece) {
  for (std::size_t pos = 0; pos < data.size(); pos += piece) {
    w.append(as_bytes(std::string_view(data).substr(pos, piece)));
  }
}

TEST(UploadWriterTest, AnObjectOfOnePartIsOnePutWhole) {
  for (std::size_t size : {std::size_t{0}, std::size_t{100}, kPart}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(overlap ? "overlap_fill" : "no overlap_fill");
      auto upload = std::make_shared<RecordingUpload>();
      auto pool = small_pool(2);
      auto w = writer_for(upload, pool, 4, false, overlap);
      const std::string data = pattern(size, 1);
      append_in_pieces(*w, data, 33);
      EXPECT_EQ(w->position(), size);
      w->commit();
      EXPECT_EQ(upload->whole_calls, 1) << size;
      EXPECT_EQ(upload->whole, data) << size;
      EXPECT_EQ(upload->starts, 0) << size;
      EXPECT_TRUE(upload->parts.empty()) << size;
      EXPECT_EQ(pool->leased_buffers(), 0u);
      EXPECT_THROW(w->commit(), UsageError);
      EXPECT_THROW(w->append(as_bytes(std::string_view("x"))), UsageError);
    }
  }
}

TEST(UploadWriterTest, PartsGoInParallelWithTheirOffsetsAndMemoryStaysInThePool) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->wait_for_company = true;
  auto pool = small_pool(4);
  auto w = writer_for(upload, pool, 3, false);
  const std::string data = pattern(10 * kPart + 17, 1);
  append_in_pieces(*w, data, 777);
  EXPECT_LE(pool->allocated_buffers(), 4u);
  w->commit();
  EXPECT_EQ(upload->starts, 1);
  EXPECT_EQ(upload->whole_calls, 0);
  EXPECT_EQ(upload->parts.size(), 11u);  // the 17-byte tail is a part of its own
  EXPECT_EQ(upload->finished_parts, 11u);
  EXPECT_EQ(upload->finished_size, data.size());
  EXPECT_TRUE(upload->tail.empty());
  EXPECT_EQ(upload->assembled(), data);
  EXPECT_GE(upload->max_in_flight, 2);
  EXPECT_LE(upload->max_in_flight, 3);
  EXPECT_EQ(upload->aborts, 0);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

TEST(UploadWriterTest, InOrderServicesGetOnePartAtATimeAndTheTailInFinish) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(2);
  auto w = writer_for(upload, pool, 1, true);
  const std::string data = pattern(5 * kPart, 1);  // the last full part is the tail
  append_in_pieces(*w, data, 1000);
  w->commit();
  EXPECT_EQ(upload->parts.size(), 4u);
  EXPECT_EQ(upload->finished_parts, 4u);
  EXPECT_EQ(upload->tail.size(), kPart);
  EXPECT_EQ(upload->finished_size, data.size());
  EXPECT_EQ(upload->assembled(), data);
  EXPECT_EQ(upload->max_in_flight, 1);
}

TEST(UploadWriterTest, AFailedPartFailsTheWriterWhichRefusesCommitAndAbortsOnDestruction) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->fail_part = 1;
  auto pool = small_pool(3);
  {
    auto w = writer_for(upload, pool, 2, false);
    const std::string data = pattern(kPart, 1);
    bool failed = false;
    for (int i = 0; i < 64 && !failed; ++i) {
      try {
        w->append(as_bytes(data));
      } catch (const StorageError& e) {
        EXPECT_NE(std::string(e.what()).find("part failed"), std::string::npos) << e.what();
        failed = true;
      }
    }
    ASSERT_TRUE(failed);
    // Part 1 is missing: committing would publish a hole.
    EXPECT_THROW(w->append(as_bytes(data)), UsageError);
    try {
      w->commit();
      FAIL() << "commit after a failed part";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("t://k"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(upload->aborts, 1);
  EXPECT_EQ(upload->finished_parts, 0u);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

TEST(UploadWriterTest, AnAbandonedWriterAbortsAStartedUploadOnly) {
  auto pool = small_pool(4);
  auto started = std::make_shared<RecordingUpload>();
  {
    auto w = writer_for(started, pool, 2, false);
    append_in_pieces(*w, pattern(3 * kPart + 1, 1), 500);
  }
  EXPECT_EQ(started->starts, 1);
  EXPECT_EQ(started->aborts, 1);
  EXPECT_EQ(started->finished_parts, 0u);
  auto small = std::make_shared<RecordingUpload>();
  {
    auto w = writer_for(small, pool, 2, false);
    w->append(as_bytes(std::string_view("abc")));
  }
  EXPECT_EQ(small->starts, 0);
  EXPECT_EQ(small->aborts, 0);  // nothing was started, nothing to abort
  EXPECT_EQ(small->whole_calls, 0);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

TEST(UploadWriterTest, AFailedFinishAbortsOnceAndRethrows) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->fail_finish = true;
  auto pool = small_pool(4);
  {
    auto w = writer_for(upload, pool, 2, false);
    append_in_pieces(*w, pattern(2 * kPart + 5, 1), 4096);
    EXPECT_THROW(w->commit(), StorageError);
    EXPECT_EQ(upload->aborts, 1);
    EXPECT_THROW(w->commit(), UsageError);
  }
  EXPECT_EQ(upload->aborts, 1);  // not again at destruction
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// Without overlap_fill (GCS sessions): the append() that needs a full buffer emptied uploads
// it on the caller's thread and refills it, so when append() returns no part is in flight,
// every full buffer but the last is uploaded, and the writer holds one buffer.
TEST(UploadWriterTest, WithoutOverlapEachPartUploadsInTheAppendFromOneBuffer) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(4);
  upload->pool = pool.get();
  auto w = writer_for(upload, pool, /*parts_in_flight=*/4, /*tail_in_finish=*/true, /*overlap_fill=*/false);
  const std::string data = pattern(5 * kPart + 100, 2);
  for (std::size_t pos = 0; pos < data.size(); pos += 1000) {
    w->append(as_bytes(std::string_view(data).substr(pos, 1000)));
    // A full buffer goes when the byte after it arrives, and is done when append() returns.
    EXPECT_EQ(upload->parts.size(), (w->position() - 1) / kPart) << w->position();
    EXPECT_EQ(upload->in_flight(), 0) << w->position();
    EXPECT_EQ(pool->leased_buffers(), 1u) << w->position();
  }
  w->commit();
  EXPECT_EQ(upload->starts, 1);
  ASSERT_EQ(upload->parts.size(), 5u);
  for (const auto& [index, part] : upload->parts) EXPECT_EQ(part.second.size(), kPart) << index;
  EXPECT_EQ(upload->tail.size(), 100u);
  EXPECT_EQ(upload->finished_parts, 5u);
  EXPECT_EQ(upload->finished_size, data.size());
  EXPECT_EQ(upload->assembled(), data);
  EXPECT_EQ(upload->max_in_flight, 1);
  EXPECT_EQ(upload->part_threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(upload->leased_during_part, std::vector<std::size_t>(5, 1));  // only the part's own
  EXPECT_EQ(pool->allocated_buffers(), 1u);
  EXPECT_EQ(pool->leased_buffers(), 0u);
  EXPECT_EQ(upload->aborts, 0);
}

// Without overlap_fill and without tail_in_finish (S3-style parts), commit() uploads the
// last part itself, then finish() publishes.
TEST(UploadWriterTest, WithoutOverlapCommitUploadsTheLastPart) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(2);
  auto w = writer_for(upload, pool, 2, /*tail_in_finish=*/false, /*overlap_fill=*/false);
  const std::string data = pattern(3 * kPart + 7, 3);
  append_in_pieces(*w, data, kPart);
  EXPECT_EQ(upload->parts.size(), 3u);  // the 7 bytes wait for commit
  w->commit();
  ASSERT_EQ(upload->parts.size(), 4u);
  EXPECT_EQ(upload->parts[3].second.size(), 7u);
  EXPECT_TRUE(upload->tail.empty());
  EXPECT_EQ(upload->finished_parts, 4u);
  EXPECT_EQ(upload->assembled(), data);
  EXPECT_EQ(upload->part_threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(pool->allocated_buffers(), 1u);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// Without overlap_fill a failed part fails the very append() that sent it, which aborts the
// upload before it throws; the writer then refuses appends and commit, and its destruction
// does not abort again.
TEST(UploadWriterTest, WithoutOverlapAFailedPartFailsTheAppendThatSentIt) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->fail_part = 1;
  auto pool = small_pool(2);
  {
    auto w = writer_for(upload, pool, 1, /*tail_in_finish=*/true, /*overlap_fill=*/false);
    const std::string data = pattern(2 * kPart, 1);
    w->append(as_bytes(data));  // part 0 uploaded, part 1 full and waiting
    EXPECT_EQ(upload->parts.size(), 1u);
    try {
      w->append(as_bytes(std::string_view("x")));  // sends part 1
      FAIL() << "the append that sent the failing part succeeded";
    } catch (const StorageError& e) {
      EXPECT_NE(std::string(e.what()).find("part failed"), std::string::npos) << e.what();
    }
    EXPECT_THROW(w->append(as_bytes(std::string_view("y"))), UsageError);
    EXPECT_THROW(w->commit(), UsageError);
    EXPECT_EQ(upload->aborts, 1);  // at the failure, before append() threw
  }
  EXPECT_EQ(upload->aborts, 1);
  EXPECT_EQ(upload->finished_parts, 0u);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// Writes 22 x kPart + 5 bytes through a writer whose parts double every 2 (max_parts 20)
// and checks the parts: 1, 1, 2, 2, 4, 4 and 8 x kPart, then the 5 bytes left.
void expect_parts_grow_to_eight_times(UploadLimits limits, const std::shared_ptr<RecordingUpload>& upload,
                                      const std::shared_ptr<BufferPool>& pool) {
  limits.part_bytes = kPart;
  limits.max_parts = 20;
  auto w = make_upload_writer("k", "test object \"t://k\"", upload, pool, limits);
  const std::string data = pattern(22 * kPart + 5, 3);
  append_in_pieces(*w, data, 1000);
  w->commit();
  ASSERT_EQ(upload->parts.size(), 8u);
  const std::size_t expected[] = {1, 1, 2, 2, 4, 4, 8};
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(upload->parts[i].second.size(), expected[i] * kPart) << i;
  EXPECT_EQ(upload->parts[7].second.size(), 5u);
  EXPECT_EQ(upload->assembled(), data);
}

// Grown parts without overlap_fill: the given pool's buffer goes back once parts outgrow it,
// and each grown part is staged in the one buffer of the writer's own pool.
TEST(UploadWriterTest, WithoutOverlapGrownPartsLeaveTheGivenPool) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(3);
  upload->pool = pool.get();
  UploadLimits limits;
  limits.overlap_fill = false;
  expect_parts_grow_to_eight_times(limits, upload, pool);
  EXPECT_EQ(upload->leased_during_part, (std::vector<std::size_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(upload->max_in_flight, 1);
  EXPECT_EQ(pool->allocated_buffers(), 1u);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

TEST(UploadWriterTest, PartSizesDoubleEveryTenthOfTheLimit) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // S3: 10,000 parts; the first 1,000 of the given size, then doubling every 1,000.
  EXPECT_EQ(part_bytes_at(0, 8 * kMiB, 10000), 8 * kMiB);
  EXPECT_EQ(part_bytes_at(999, 8 * kMiB, 10000), 8 * kMiB);
  EXPECT_EQ(part_bytes_at(1000, 8 * kMiB, 10000), 16 * kMiB);
  EXPECT_EQ(part_bytes_at(2500, 8 * kMiB, 10000), 32 * kMiB);
  EXPECT_EQ(part_bytes_at(9999, 8 * kMiB, 10000), 4096 * kMiB);
  // No limit (GCS sessions), or one too small to split: always the given size.
  EXPECT_EQ(part_bytes_at(123456, 8 * kMiB, 0), 8 * kMiB);
  EXPECT_EQ(part_bytes_at(5, 8 * kMiB, 9), 8 * kMiB);
  // What 10,000 parts hold: 1,023 x 1,000 parts of the first size, not 10,000.
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < 10000; ++i) total += part_bytes_at(i, 8 * kMiB, 10000);
  EXPECT_EQ(total, std::uint64_t{1023} * 1000 * 8 * kMiB);  // 7.99 TiB > S3's 5 TiB objects
  std::uint64_t at_5mib = 0;
  for (std::size_t i = 0; i < 10000; ++i) at_5mib += part_bytes_at(i, 5 * kMiB, 10000);
  EXPECT_EQ(at_5mib, std::uint64_t{1023} * 1000 * 5 * kMiB);
  // Multiples of 256 KiB stay multiples (GCS chunks), and 50,000 Azure blocks double every 5,000.
  EXPECT_EQ(part_bytes_at(5000, 256 << 10, 50000) % (256 << 10), 0u);
  EXPECT_EQ(part_bytes_at(4999, 4 * kMiB, 50000), 4 * kMiB);
  EXPECT_EQ(part_bytes_at(5000, 4 * kMiB, 50000), 8 * kMiB);
}

TEST(UploadWriterTest, PartsGrowPastTheLimitsTenthInBuffersOfTheWritersOwn) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(3);
  UploadLimits limits;
  limits.parts_in_flight = 2;
  expect_parts_grow_to_eight_times(limits, upload, pool);
  EXPECT_EQ(upload->finished_parts, 8u);
  EXPECT_EQ(upload->finished_size, 22 * kPart + 5);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

TEST(UploadWriterTest, AnObjectBeyondTheLimitFailsNamingThePartSize) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = small_pool(2);
  UploadLimits limits;
  limits.part_bytes = kPart;
  limits.max_parts = 10;  // 1, 2, 4, ... 512 parts of kPart: 1,023 in all
  auto w = make_upload_writer("k", "test object \"t://k\"", upload, pool, limits);
  const std::string chunk = pattern(64 * kPart, 4);
  try {
    for (int i = 0; i < 17; ++i) w->append(as_bytes(chunk));  // 1,088 parts of kPart
    ADD_FAILURE() << "no error past 10 parts";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 10 parts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test object"), std::string::npos) << e.what();
  }
  EXPECT_LE(upload->parts.size(), 10u);
  w.reset();
  EXPECT_EQ(upload->aborts, 1);
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// --- append_borrowed() ---------------------------------------------------------------------

constexpr std::size_t kBigPart = std::size_t{64} << 10;

std::shared_ptr<BufferPool> big_pool(std::size_t buffers) {
  BufferPoolOptions options;
  options.buffer_bytes = kBigPart;
  options.capacity_bytes = buffers * kBigPart;
  options.huge_pages = false;
  return std::make_shared<BufferPool>(options);
}

std::unique_ptr<StorageWriter> borrowing_writer(std::shared_ptr<RecordingUpload> upload,
                                                std::shared_ptr<BufferPool> pool, bool borrow = true) {
  UploadLimits limits;
  limits.part_bytes = kBigPart;
  limits.parts_in_flight = 2;
  limits.borrow = borrow;
  limits.sha256 = true;
  limits.crc32c = true;
  limits.md5 = true;
  return make_upload_writer("k", "test object \"t://k\"", std::move(upload), std::move(pool), limits);
}

std::string sha256_of(std::string_view bytes) {
  Sha256 h;
  h.update(as_bytes(bytes));
  return h.hex_digest();
}

// Headers copied, tensor bytes borrowed in 256 KiB slices: the parts' pieces point into the
// caller's memory for every borrowed byte (a slice crossing a part boundary too), the
// copies sit between them, and each body's digests are those of its bytes.
TEST(UploadWriterTest, BorrowedBytesAreSentFromTheCallersMemoryWithTheCopiesBetween) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = big_pool(3);
  const std::string tensor = pattern(700 << 10, 5);
  upload->caller_bytes = as_bytes(tensor);
  auto w = borrowing_writer(upload, pool);
  std::string expected;
  const std::string header = pattern(100, 6), small = pattern(kMinBorrowBytes - 1, 7);
  w->append(as_bytes(header));
  expected += header;
  for (std::size_t at = 0; at < tensor.size(); at += 256 << 10) {
    const std::string_view slice = std::string_view(tensor).substr(at, 256 << 10);
    w->append_borrowed(as_bytes(slice));
    expected += slice;
  }
  w->append_borrowed(as_bytes(small));  // under kMinBorrowBytes: copied
  expected += small;
  w->append(as_bytes(header));
  expected += header;
  w->commit();
  EXPECT_EQ(upload->assembled(), expected);
  EXPECT_EQ(upload->borrowed_bytes, tensor.size());
  EXPECT_EQ(upload->bodies.at(0).pieces, 2u);  // the header's copy, then the tensor's first bytes
  for (const auto& [index, part] : upload->parts) {
    const RecordingUpload::BodyFacts& facts = upload->bodies.at(index);
    EXPECT_EQ(facts.sha256_hex, sha256_of(part.second)) << index;
    EXPECT_EQ(facts.crc32c, crc32c(0, as_bytes(part.second))) << index;
    EXPECT_EQ(facts.md5, md5_digest(as_bytes(part.second))) << index;
  }
  EXPECT_EQ(pool->leased_buffers(), 0u);
  EXPECT_EQ(upload->aborts, 0);
}

// A body of many pieces, borrowed and copied in turn (a pickle between tensors' slices):
// its MD5, SHA-256 and CRC-32C are those of its bytes in order, in every part.
TEST(UploadWriterTest, TheDigestsOfABodyOfManyPiecesAreThoseOfItsBytes) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = big_pool(3);
  const std::string tensor = pattern(3 * kBigPart, 11);
  upload->caller_bytes = as_bytes(tensor);
  auto w = borrowing_writer(upload, pool);
  const std::size_t slice = kMinBorrowBytes * 3 + 5;  // slices cross part boundaries
  for (std::size_t at = 0; at < tensor.size(); at += slice) {
    w->append_borrowed(as_bytes(std::string_view(tensor).substr(at, slice)));
    w->append(as_bytes(pattern(7, static_cast<std::uint32_t>(at))));
  }
  w->commit();
  ASSERT_GE(upload->parts.size(), 3u);
  for (const auto& [index, part] : upload->parts) {
    const RecordingUpload::BodyFacts& facts = upload->bodies.at(index);
    if (part.second.size() == kBigPart) {
      EXPECT_GT(facts.pieces, 2u) << index;  // the last may be a slice's end
    }
    EXPECT_EQ(facts.md5, md5_digest(as_bytes(part.second))) << index;
    EXPECT_EQ(facts.sha256_hex, sha256_of(part.second)) << index;
    EXPECT_EQ(facts.crc32c, crc32c(0, as_bytes(part.second))) << index;
  }
  EXPECT_EQ(upload->borrowed_bytes, tensor.size());
}

// An object of one part: put_whole() gets the pieces and digests too.
TEST(UploadWriterTest, ABorrowedObjectOfOnePartIsOnePutWholeOfItsPieces) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = big_pool(2);
  const std::string tensor = pattern(kBigPart / 2, 8), header = pattern(10, 9);
  upload->caller_bytes = as_bytes(tensor);
  auto w = borrowing_writer(upload, pool);
  w->append(as_bytes(header));
  w->append_borrowed(as_bytes(tensor));
  w->commit();
  EXPECT_EQ(upload->whole, header + tensor);
  EXPECT_EQ(upload->whole_body.pieces, 2u);
  EXPECT_EQ(upload->whole_body.sha256_hex, sha256_of(header + tensor));
  EXPECT_EQ(upload->whole_body.crc32c, crc32c(0, as_bytes(header + tensor)));
  EXPECT_EQ(upload->whole_body.md5, md5_digest(as_bytes(header + tensor)));
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// A part that fails ends the borrowing before append_borrowed() throws: no part is in
// flight any more and the upload is aborted, so the caller may free its bytes at once.
TEST(UploadWriterTest, BorrowingEndsBeforeAFailedAppendThrows) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->fail_part = 1;
  upload->part_delay = std::chrono::milliseconds(5);
  auto pool = big_pool(3);
  std::string tensor = pattern(kBigPart, 3);
  auto w = borrowing_writer(upload, pool);
  bool failed = false;
  for (int i = 0; i < 64 && !failed; ++i) {
    try {
      w->append_borrowed(as_bytes(tensor));
    } catch (const StorageError& e) {
      failed = true;
      EXPECT_EQ(upload->in_flight(), 0);
      EXPECT_EQ(upload->aborts, 1);
    }
  }
  ASSERT_TRUE(failed);
  tensor.assign(tensor.size(), 'x');  // the caller reuses its memory
  EXPECT_THROW(w->append_borrowed(as_bytes(tensor)), UsageError);
  w.reset();
  EXPECT_EQ(upload->aborts, 1);
  EXPECT_EQ(pool->leased_buffers(), 0u);
  for (const auto& [index, part] : upload->parts) {
    EXPECT_EQ(part.second, pattern(kBigPart, 3)) << index;  // read before the caller reused it
  }
}

// A writer destroyed without commit() waits for its parts in flight, which read their
// borrowed pieces to the end, before the destructor returns.
TEST(UploadWriterTest, AnAbandonedWriterWaitsForItsBorrowedPartsBeforeItIsGone) {
  auto upload = std::make_shared<RecordingUpload>();
  upload->part_delay = std::chrono::milliseconds(20);
  auto pool = big_pool(3);
  const std::string tensor = pattern(3 * kBigPart + 100, 4);
  upload->caller_bytes = as_bytes(tensor);
  {
    auto w = borrowing_writer(upload, pool);
    w->append_borrowed(as_bytes(tensor));
    EXPECT_GE(upload->in_flight() + static_cast<int>(upload->parts.size()), 1);
  }
  EXPECT_EQ(upload->in_flight(), 0);
  EXPECT_EQ(upload->aborts, 1);
  EXPECT_EQ(upload->finished_parts, 0u);
  ASSERT_FALSE(upload->parts.empty());
  for (const auto& [index, part] : upload->parts) {
    EXPECT_EQ(part.second, tensor.substr(index * kBigPart, kBigPart)) << index;
  }
  EXPECT_EQ(pool->leased_buffers(), 0u);
}

// Without UploadLimits::borrow (GCS) append_borrowed() copies: one piece per body,
// in the pool's buffers.
TEST(UploadWriterTest, WithoutBorrowEveryBodyIsOneCopiedPiece) {
  auto upload = std::make_shared<RecordingUpload>();
  auto pool = big_pool(3);
  const std::string tensor = pattern(2 * kBigPart + 5, 2);
  upload->caller_bytes = as_bytes(tensor);
  auto w = borrowing_writer(upload, pool, /*borrow=*/false);
  w->append(as_bytes(std::string_view("head")));
  w->append_borrowed(as_bytes(tensor));
  w->commit();
  EXPECT_EQ(upload->assembled(), "head" + tensor);
  EXPECT_EQ(upload->borrowed_bytes, 0u);
  for (const auto& [index, facts] : upload->bodies) EXPECT_EQ(facts.pieces, 1u) << index;
}

TEST(PartBodyTest, ContiguousIsTheOnePieceOrNothing) {
  const std::string bytes = "abc";
  PartBody body;
  EXPECT_TRUE(body.contiguous().empty());
  body.pieces = {as_bytes(bytes)};
  EXPECT_EQ(body.contiguous().data(), as_bytes(bytes).data());
  body.pieces.push_back(as_bytes(bytes));
  EXPECT_THROW(body.contiguous(), Error);
}

}  // namespace
}  // namespace shardpoint::storage::http
