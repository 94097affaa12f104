// The item reader (item_reader.h) on blobs a 1-rank save wrote into MemoryStorage: the block
// piece codec round trips and refuses malformed input; SourceCache opens each file once;
// SavedTensorBlob finds the data start the load index records, reads any sub-box of its
// chunk into a destination box (with and without the sidecar, whole blocks and partial
// ones), refuses a blob whose dtype or shape is not what `.metadata` says and names file,
// fqn and block on a checksum mismatch; read_saved_object returns the saved object and
// verifies it; needed_blob_ranges covers head, data and tail.
#include "engine/item_reader.h"
#include "engine/saved_object.h"

#include <gtest/gtest.h>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_index.h"
#include "engine/checkpoint_test_state.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "storage/memory_storage.h"

namespace shardpoint::engine {
namespace {

using testing::box_bytes;
using testing::tensor_specs;

std::shared_ptr<storage::Storage> saved(std::uint64_t block_bytes = 16) {
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  testing::RankState state = testing::make_rank_state(0, 1, true);
  SaveOptions options;
  options.checksum_block_bytes = block_bytes;
  comm::ThreadGroup group(1, comm::CommOptions{std::chrono::seconds(20)});
  group.run([&](comm::Communicator& comm) { save(state.root, *st, comm, options); });
  return st;
}

struct Chunk {
  format::MetadataIndex index;
  format::StorageInfo info;
  format::ChunkStorageMetadata chunk;
  DType dtype;
};

Chunk chunk_of(storage::Storage& st, const std::string& fqn) {
  const format::Metadata md = read_metadata(st);
  const auto& t = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(fqn));
  const format::MetadataIndex index{fqn, t.chunks[0].offsets, 0};
  return {index, md.storage_data.at(index), t.chunks[0], t.properties.dtype};
}

// A ReadItem copying `lengths` at `at` of the (only) chunk of fqn into a box of the same
// extent (dest offsets 0).
ReadItem item_for(const Chunk& c, format::Shape at, format::Shape lengths) {
  ReadItem item;
  item.type = ReadItemType::kTensor;
  item.dest_index = format::MetadataIndex{c.index.fqn, at, std::nullopt};
  item.dest_offsets = format::Shape(at.size(), 0);
  item.storage_index = c.index;
  item.storage_offsets = at;
  item.lengths = lengths;
  return item;
}

const testing::TensorSpec& spec(const std::string& path) {
  for (const auto& s : tensor_specs()) {
    if (s.path == path) return s;
  }
  throw std::runtime_error(path);
}

TEST(BlockPiecesTest, RoundTripAndMalformedInput) {
  const std::vector<BlockPiece> pieces = {{"__0_0.distcp", 0, 16, 20, 0xdeadbeef}, {"", 1 << 20, 0, 1, 7}};
  std::vector<BlockPiece> got = {{"kept", 1, 2, 3, 4}};
  decode_block_pieces(encode_block_pieces(pieces), "pieces", got);
  ASSERT_EQ(got.size(), 3u);  // appended
  EXPECT_EQ(got[1], pieces[0]);
  EXPECT_EQ(got[2], pieces[1]);
  const std::string bytes = encode_block_pieces(pieces);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<BlockPiece> out;
    EXPECT_THROW(decode_block_pieces(bytes.substr(0, n), "pieces", out), FormatError) << n;
  }
  std::vector<BlockPiece> out;
  try {
    decode_block_pieces(bytes + "x", "rank 3 pieces", out);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 pieces"), std::string::npos) << e.what();
  }
  std::string huge = encode_block_pieces({});
  std::memset(huge.data(), 0xff, 8);  // 2^64 - 1 pieces in 8 bytes
  EXPECT_THROW(decode_block_pieces(huge, "pieces", out), FormatError);
}

TEST(SourceCacheTest, OpensEachFileOnce) {
  auto st = saved();
  SourceCache cache(*st);
  auto a = cache.get("__0_0.distcp");
  EXPECT_EQ(cache.get("__0_0.distcp"), a);
  EXPECT_EQ(a->size(), st->stat("__0_0.distcp"));
}

TEST(SavedTensorBlobTest, DataStartIsWhatTheLoadIndexRecords) {
  auto st = saved();
  const CheckpointIndex index = decode_checkpoint_index(st->try_read_all(kIndexKey).value(), "index");
  SourceCache cache(*st);
  for (const auto& s : tensor_specs()) {
    const Chunk c = chunk_of(*st, s.path);
    SavedTensorBlob blob(cache.get(c.info.relative_path), c.info, s.path, c.chunk, c.dtype);
    EXPECT_TRUE(blob.direct()) << s.path;
    EXPECT_EQ(blob.data_start(), index.data_offsets.at(c.index)) << s.path;
    EXPECT_EQ(blob.data_start() % 64, 0u) << s.path;
  }
}

// Every sub-box of model.w [10, 3] float32 and model.c [4, 7] int32, verified against 16-byte
// blocks (so most boxes cut blocks) and unverified, parsed and from the load index.
TEST(SavedTensorBlobTest, ReadsEverySubBox) {
  auto st = saved();
  const ChecksumSidecar sidecar = ChecksumSidecar::decode(st->try_read_all(kChecksumSidecar).value(), "sidecar");
  const CheckpointIndex index = decode_checkpoint_index(st->try_read_all(kIndexKey).value(), "index");
  SourceCache cache(*st);
  for (const std::string fqn : {"model.w", "model.c"}) {
    const Chunk c = chunk_of(*st, fqn);
    const auto& s = spec(fqn);
    const BlobChecksums verified{sidecar.algorithm(), sidecar.block_size(),
                                 sidecar.find(c.info.relative_path, c.info.offset)};
    ASSERT_NE(verified.item, nullptr);
    for (const BlobChecksums& checks : {verified, BlobChecksums{}}) {
      for (bool from_index : {false, true}) {
        SavedTensorBlob blob(cache.get(c.info.relative_path), c.info, fqn, c.chunk, c.dtype,
                             from_index ? std::optional<std::uint64_t>(index.data_offsets.at(c.index)) : std::nullopt);
        for (std::int64_t r0 = 0; r0 < s.shape[0]; ++r0) {
          for (std::int64_t r1 = r0 + 1; r1 <= s.shape[0]; ++r1) {
            for (std::int64_t c0 = 0; c0 < s.shape[1]; c0 += 2) {
              const format::Shape at{r0, c0}, lengths{r1 - r0, s.shape[1] - c0};
              std::vector<std::byte> dest(static_cast<std::size_t>(volume(lengths)) * dtype_itemsize(s.dtype));
              blob.read_into(item_for(c, at, lengths), dest, lengths, checks);
              EXPECT_EQ(dest, box_bytes(s, Box{at, lengths})) << fqn << " rows " << r0 << ":" << r1 << " col " << c0;
            }
          }
        }
      }
    }
  }
}

// Partial blocks handed to the caller as crc32c pieces (load's path) instead of read here.
TEST(SavedTensorBlobTest, PartialBlocksBecomePiecesWhenAsked) {
  auto st = saved();
  const ChecksumSidecar sidecar = ChecksumSidecar::decode(st->try_read_all(kChecksumSidecar).value(), "sidecar");
  SourceCache cache(*st);
  const Chunk c = chunk_of(*st, "model.w");
  const BlobChecksums checks{sidecar.algorithm(), sidecar.block_size(),
                             sidecar.find(c.info.relative_path, c.info.offset)};
  SavedTensorBlob blob(cache.get(c.info.relative_path), c.info, "model.w", c.chunk, c.dtype);
  const format::Shape at{1, 0}, lengths{1, 3};  // 12 bytes from data start + 12: cuts 16-byte blocks
  std::vector<std::byte> dest(12);
  std::vector<BlockPiece> pieces;
  blob.read_into(item_for(c, at, lengths), dest, lengths, checks, &pieces);
  EXPECT_EQ(dest, box_bytes(spec("model.w"), Box{at, lengths}));
  ASSERT_FALSE(pieces.empty());
  for (const BlockPiece& p : pieces) {
    EXPECT_EQ(p.file, c.info.relative_path);
    EXPECT_EQ(p.blob_offset, c.info.offset);
    EXPECT_LT(p.begin, p.end);
    EXPECT_EQ(p.begin / 16, (p.end - 1) / 16) << "a piece lies in one block";
  }
  // The pieces of this one reader complete no block: verify_block_pieces reads the rest.
  ReadCounts counts;
  verify_block_pieces(
      pieces, pieces, sidecar, [&](const std::string& f) { return cache.get(f); }, counts);
  EXPECT_GT(counts.data_bytes, 0u);
}

TEST(SavedTensorBlobTest, RefusesWhatMetadataDoesNotSay) {
  auto st = saved();
  SourceCache cache(*st);
  const Chunk c = chunk_of(*st, "model.w");
  try {
    SavedTensorBlob blob(cache.get(c.info.relative_path), c.info, "model.w", c.chunk, DType::kInt32);
    FAIL();
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(c.info.relative_path + ": item \"model.w\" chunk ", 0), 0u) << what;
    EXPECT_NE(what.find("expected dtype int32"), std::string::npos) << what;
  }
  format::ChunkStorageMetadata wrong = c.chunk;
  wrong.sizes[0] += 1;
  EXPECT_THROW(SavedTensorBlob(cache.get(c.info.relative_path), c.info, "model.w", wrong, c.dtype), FormatError);
  format::StorageInfo past = c.info;
  past.length = cache.get(c.info.relative_path)->size() + 1;
  EXPECT_THROW(SavedTensorBlob(cache.get(c.info.relative_path), past, "model.w", c.chunk, c.dtype), FormatError);
}

TEST(SavedTensorBlobTest, ChecksumMismatchNamesFileFqnAndBlock) {
  auto st = saved();
  const ChecksumSidecar sidecar = ChecksumSidecar::decode(st->try_read_all(kChecksumSidecar).value(), "sidecar");
  const Chunk c = chunk_of(*st, "model.w");
  std::string file = st->try_read_all(c.info.relative_path).value();
  SourceCache clean(*st);
  const std::uint64_t start =
      SavedTensorBlob(clean.get(c.info.relative_path), c.info, "model.w", c.chunk, c.dtype).data_start();
  file[static_cast<std::size_t>(c.info.offset + start + 20)] ^= 0x01;
  st->write_atomic(c.info.relative_path, as_bytes(file));
  SourceCache cache(*st);
  SavedTensorBlob blob(cache.get(c.info.relative_path), c.info, "model.w", c.chunk, c.dtype);
  const BlobChecksums checks{sidecar.algorithm(), sidecar.block_size(),
                             sidecar.find(c.info.relative_path, c.info.offset)};
  std::vector<std::byte> dest(10 * 3 * 4);
  try {
    blob.read_into(item_for(c, {0, 0}, {10, 3}), dest, {10, 3}, checks);
    FAIL();
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(c.info.relative_path), std::string::npos) << what;
    EXPECT_NE(what.find("\"model.w\""), std::string::npos) << what;
    EXPECT_NE(what.find("checksum mismatch in block " + std::to_string((start + 20) / 16)), std::string::npos) << what;
  }
  // Unverified, the damaged byte is read as it is.
  blob.read_into(item_for(c, {0, 0}, {10, 3}), dest, {10, 3}, BlobChecksums{});
  EXPECT_NE(dest, box_bytes(spec("model.w"), Box{{0, 0}, {10, 3}}));
}

TEST(ReadSavedObjectTest, ReturnsTheObjectAndVerifiesIt) {
  auto st = saved();
  const format::Metadata md = read_metadata(*st);
  const format::StorageInfo info = md.storage_data.at(format::MetadataIndex{"epoch", std::nullopt, std::nullopt});
  const ChecksumSidecar sidecar = ChecksumSidecar::decode(st->try_read_all(kChecksumSidecar).value(), "sidecar");
  const BlobChecksums checks{sidecar.algorithm(), sidecar.block_size(), sidecar.find(info.relative_path, info.offset)};
  ASSERT_NE(checks.item, nullptr);
  SourceCache cache(*st);
  ReadCounts counts;
  pickle::ValuePtr v = read_saved_object(cache.get(info.relative_path), info, "epoch", checks, counts);
  EXPECT_TRUE(pickle::deep_equal(*v, *pickle::Value::integer(7)));
  EXPECT_EQ(counts.data_bytes, info.length);

  std::string file = st->try_read_all(info.relative_path).value();
  file[static_cast<std::size_t>(info.offset + info.length / 2)] ^= 0x01;
  st->write_atomic(info.relative_path, as_bytes(file));
  SourceCache damaged(*st);
  try {
    read_saved_object(damaged.get(info.relative_path), info, "epoch", checks, counts);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(info.relative_path + ": item \"epoch\": checksum mismatch", 0), 0u)
        << e.what();
  }
  format::StorageInfo past = info;
  past.offset = file.size();
  EXPECT_THROW(read_saved_object(damaged.get(info.relative_path), past, "epoch", BlobChecksums{}, counts), FormatError);
}

TEST(SavedTensorBlobTest, NeededBlobRangesCoverHeadDataAndTail) {
  auto st = saved();
  const Chunk c = chunk_of(*st, "model.w");
  const ReadItem item = item_for(c, {2, 0}, {3, 3});
  const std::vector<ByteRange> ranges = SavedTensorBlob::needed_blob_ranges({&item}, c.chunk.sizes, 4, c.info.length);
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().offset, 0u);
  const ByteRange& last = ranges.back();
  EXPECT_EQ(last.offset + last.length, c.info.length);
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_GT(ranges[i].offset, ranges[i - 1].offset + ranges[i - 1].length) << "sorted and merged";
  }
}

}  // namespace
}  // namespace shardpoint::engine
