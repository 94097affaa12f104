// The executor's small codecs: per-block checksums, the persisted sidecar, and the wire
// forms of plans and write results.
#include <gtest/gtest.h>

#include "core/checksum.h"
#include "engine/block_checksum.h"
#include "engine/checksum_sidecar.h"
#include "engine/plan_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return s;
}

TEST(BlockChecksumTest, BlocksMatchOneShotChecksumsWhateverTheSlicing) {
  const std::string data = pattern(10000);
  for (ChecksumAlgorithm a : {ChecksumAlgorithm::kCrc32c, ChecksumAlgorithm::kXxh3}) {
    for (std::size_t slice : {1u, 7u, 1000u, 4096u, 10000u}) {
      BlockChecksummer sum(a, 4096);
      for (std::size_t pos = 0; pos < data.size(); pos += slice) {
        sum.update(as_bytes(std::string_view(data).substr(pos, slice)));
      }
      EXPECT_EQ(sum.length(), data.size());
      EXPECT_EQ(sum.finish_item(), checksum_of(a, as_bytes(data)));
      const std::vector<std::uint64_t> blocks = sum.take_blocks();
      ASSERT_EQ(blocks.size(), 3u);
      EXPECT_EQ(blocks[0], checksum_of(a, as_bytes(std::string_view(data).substr(0, 4096))));
      EXPECT_EQ(blocks[1], checksum_of(a, as_bytes(std::string_view(data).substr(4096, 4096))));
      EXPECT_EQ(blocks[2], checksum_of(a, as_bytes(std::string_view(data).substr(8192))));
    }
  }
  EXPECT_EQ(checksum_of(ChecksumAlgorithm::kCrc32c, as_bytes(data)), crc32c(0, as_bytes(data)));
  EXPECT_EQ(checksum_of(ChecksumAlgorithm::kXxh3, as_bytes(data)), xxh3_64(as_bytes(data)));
  BlockChecksummer empty(ChecksumAlgorithm::kCrc32c, 16);
  EXPECT_EQ(empty.finish_item(), 0u);
  EXPECT_TRUE(empty.take_blocks().empty());
}

TEST(BlockChecksumTest, StreamingChecksumIsOneShotOverAnySplit) {
  const std::string data = pattern(5000);
  for (ChecksumAlgorithm a : {ChecksumAlgorithm::kCrc32c, ChecksumAlgorithm::kXxh3, ChecksumAlgorithm::kNone}) {
    StreamingChecksum sum(a);
    sum.update(as_bytes(std::string_view("stale")));
    sum.reset();
    for (std::size_t pos = 0; pos < data.size(); pos += 333) {
      sum.update(as_bytes(std::string_view(data).substr(pos, 333)));
    }
    EXPECT_EQ(sum.value(), checksum_of(a, as_bytes(data))) << checksum_algorithm_name(a);
  }
}

TEST(BlockChecksumTest, HexAndNames) {
  EXPECT_EQ(checksum_to_hex(ChecksumAlgorithm::kCrc32c, 0xab), "000000ab");
  EXPECT_EQ(checksum_to_hex(ChecksumAlgorithm::kXxh3, 0xab), "00000000000000ab");
  EXPECT_EQ(checksum_from_hex(ChecksumAlgorithm::kCrc32c, "deadbeef", "x"), 0xdeadbeefu);
  EXPECT_THROW(checksum_from_hex(ChecksumAlgorithm::kCrc32c, "deadbee", "x"), FormatError);
  EXPECT_THROW(checksum_from_hex(ChecksumAlgorithm::kCrc32c, "deadbeeg", "x"), FormatError);
  EXPECT_EQ(checksum_algorithm_name(ChecksumAlgorithm::kCrc32c), "crc32c");
  EXPECT_EQ(checksum_algorithm_name(ChecksumAlgorithm::kXxh3), "xxh3");
  EXPECT_EQ(checksum_algorithm_from_name("xxh3", "s"), ChecksumAlgorithm::kXxh3);
  EXPECT_THROW(checksum_algorithm_from_name("md5", "s"), FormatError);
}

TEST(ChecksumSidecarTest, RoundTripsAndHasTheDocumentedShape) {
  ChecksumSidecar sidecar(ChecksumAlgorithm::kCrc32c, 1024);
  sidecar.add(ItemChecksums{"__0_0.distcp", 1500, 1500, "w", format::Shape{0, 0}, 0x1234, {1, 2}});
  sidecar.add(ItemChecksums{"__0_0.distcp", 0, 1500, "step", std::nullopt, 0xffffffff, {3, 4}});
  const std::string json = sidecar.encode();
  EXPECT_NE(json.find("\"format\": \"shardpoint-checksums\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"version\": 1"), std::string::npos);
  EXPECT_NE(json.find("\"algorithm\": \"crc32c\""), std::string::npos);
  EXPECT_NE(json.find("\"block_size\": 1024"), std::string::npos);
  EXPECT_NE(json.find("\"checksum\": \"00001234\""), std::string::npos);
  EXPECT_LT(json.find("\"step\""), json.find("\"w\""));  // sorted by (file, offset)
  const ChecksumSidecar back = ChecksumSidecar::decode(json, "s");
  EXPECT_EQ(back.algorithm(), ChecksumAlgorithm::kCrc32c);
  EXPECT_EQ(back.block_size(), 1024u);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(*back.find("__0_0.distcp", 1500), *sidecar.find("__0_0.distcp", 1500));
  EXPECT_EQ(*back.find("__0_0.distcp", 0), *sidecar.find("__0_0.distcp", 0));
  EXPECT_EQ(back.find("__0_0.distcp", 1), nullptr);
}

TEST(ChecksumSidecarTest, RejectsMalformedFiles) {
  EXPECT_THROW(ChecksumSidecar::decode("{", "s"), FormatError);
  EXPECT_THROW(ChecksumSidecar::decode(R"({"format":"other","version":1})", "s"), FormatError);
  EXPECT_THROW(
      ChecksumSidecar::decode(
          R"({"format":"shardpoint-checksums","version":2,"algorithm":"crc32c","block_size":4,"items":[]})", "s"),
      FormatError);
  EXPECT_THROW(
      ChecksumSidecar::decode(
          R"({"format":"shardpoint-checksums","version":1,"algorithm":"crc32c","block_size":0,"items":[]})", "s"),
      FormatError);
  // 9 bytes in blocks of 4 need 3 block checksums.
  try {
    ChecksumSidecar::decode(
        R"({"format":"shardpoint-checksums","version":1,"algorithm":"crc32c","block_size":4,"items":[
      {"file":"__0_0.distcp","offset":0,"length":9,"fqn":"w","checksum":"00000000","blocks":["00000000"]}]})",
        "side");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("side: item \"w\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected 3 block checksums"), std::string::npos) << e.what();
  }
  // A malformed block checksum is named with its item; a number where hex is expected fails too.
  try {
    ChecksumSidecar::decode(
        R"({"format":"shardpoint-checksums","version":1,"algorithm":"crc32c","block_size":4,"items":[
      {"file":"__0_0.distcp","offset":8,"length":4,"fqn":"w","checksum":"00000000","blocks":["0000000g"]}]})",
        "side");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "side: item \"w\" (__0_0.distcp at 8) block: expected 8 hex digits, found \"0000000g\""),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ChecksumSidecar::decode(
                   R"({"format":"shardpoint-checksums","version":1,"algorithm":"crc32c","block_size":4,"items":[
      {"file":"__0_0.distcp","offset":8,"length":4,"fqn":"w","checksum":7,"blocks":["00000000"]}]})",
                   "side"),
               FormatError);
  // Integer fields must be JSON integers: a float out of range used to be cast (undefined
  // behaviour, found by fuzz/checksum_sidecar_fuzzer).
  for (const char* item :
       {R"({"file":"f","offset":1e300,"length":4,"checksum":"00000000","blocks":["00000000"]})",
        R"({"file":"f","offset":0,"length":-4,"checksum":"00000000","blocks":["00000000"]})",
        R"({"file":"f","offset":0,"length":4,"chunk_offsets":[1.5],"checksum":"00000000","blocks":["00000000"]})"}) {
    EXPECT_THROW(
        ChecksumSidecar::decode(
            std::string(
                R"({"format":"shardpoint-checksums","version":1,"algorithm":"crc32c","block_size":4,"items":[)") +
                item + "]}",
            "side"),
        FormatError)
        << item;
  }
  EXPECT_THROW(
      ChecksumSidecar::decode(
          R"({"format":"shardpoint-checksums","version":1e99,"algorithm":"crc32c","block_size":4,"items":[]})", "side"),
      FormatError);
}

TEST(PlanCodecTest, SavePlanRoundTrips) {
  SavePlan plan;
  plan.rank = 2;
  WriteItem t;
  t.index = format::MetadataIndex{"model.w", format::Shape{4, 0}, 1};
  t.type = WriteItemType::kTensor;
  t.dtype = DType::kBFloat16;
  t.requires_grad = true;
  t.global_size = {8, 3};
  t.chunk = format::ChunkStorageMetadata{{4, 0}, {4, 3}};
  t.nbytes = 24;
  t.file = "__2_0.distcp";
  t.index_in_file = 1;
  WriteItem b;
  b.index = format::MetadataIndex{"step", std::nullopt, std::nullopt};
  b.type = WriteItemType::kBytes;
  b.bytes_size = 17;
  b.file = "__2_0.distcp";
  b.index_in_file = 0;
  plan.items = {b, t};
  plan.planner_data["model.w"] = {std::string("model"), std::string("w")};
  plan.planner_data["g.0.lr"] = {std::string("g"), std::int64_t{0}, std::string("lr")};
  plan.files = {"__2_0.distcp", "__2_1.distcp"};
  EXPECT_EQ(decode_save_plan(encode_save_plan(plan), "p"), plan);
  EXPECT_THROW(decode_save_plan("{}", "p"), FormatError);
}

TEST(PlanCodecTest, WrittenItemsAndPartsRoundTrip) {
  WrittenItem w;
  w.index = format::MetadataIndex{"w", format::Shape{}, 0};
  w.info = format::StorageInfo{"__0_0.distcp", 747, 1187, {}};
  w.checksum = 0xfedcba9876543210ull;
  w.blocks = {1, 0xffffffffffffffffull};
  WrittenItem o;
  o.index = format::MetadataIndex{"tag", std::nullopt, std::nullopt};
  o.info = format::StorageInfo{"__0_0.distcp", 0, 747, {}};
  const std::vector<WrittenItem> items{o, w};
  EXPECT_EQ(decode_written_items(encode_written_items(items), "r"), items);
  const std::vector<std::string> parts{"", std::string("a\0b", 3), pattern(300)};
  EXPECT_EQ(unpack_parts(pack_parts(parts), "m"), parts);
  std::string cut = pack_parts(parts);
  cut.pop_back();
  EXPECT_THROW(unpack_parts(cut, "m"), FormatError);
}

TEST(PlanCodecTest, RankMessageBytesNeverChange) {
  // The wire byte of each status, fixed: ranks read each other's messages.
  EXPECT_EQ(encode_rank_message(RankStatus::kPlan, "body"), "Pbody");
  EXPECT_EQ(encode_rank_message(RankStatus::kWriteResult, "body"), "Rbody");
  EXPECT_EQ(encode_rank_message(RankStatus::kMetadata, "body"), "Mbody");
  EXPECT_EQ(encode_rank_message(RankStatus::kError, "error\nboom"), "Eerror\nboom");
  EXPECT_EQ(encode_rank_message(RankStatus::kError), "E");
}

TEST(PlanCodecTest, RankMessageRoundTrips) {
  const std::string body("x\0y", 3);
  for (RankStatus status : {RankStatus::kPlan, RankStatus::kWriteResult, RankStatus::kMetadata, RankStatus::kError}) {
    const std::string message = encode_rank_message(status, body);
    const RankMessage m = decode_rank_message(message);
    EXPECT_EQ(m.status, status);
    EXPECT_EQ(m.body, body);
    const RankMessage bare = decode_rank_message(encode_rank_message(status));
    EXPECT_EQ(bare.status, status);
    EXPECT_TRUE(bare.body.empty());
  }
}

TEST(PlanCodecTest, RankMessageWithoutAKnownStatusHasNone) {
  const RankMessage empty = decode_rank_message("");
  EXPECT_FALSE(empty.status.has_value());
  EXPECT_TRUE(empty.body.empty());
  for (char c : {'p', 'X', '\0', '\xff'}) {
    const std::string message = std::string(1, c) + "rest";
    const RankMessage m = decode_rank_message(message);
    EXPECT_FALSE(m.status.has_value()) << static_cast<int>(c);
    EXPECT_EQ(m.body, "rest");
  }
}

}  // namespace
}  // namespace shardpoint::engine
