// zstd items (compressed_item.h, docs/dcp-format.md §2.4) through the engine: a 2-rank save
// with SaveOptions::compression records "stream.zstd/1" on every item (the written items
// carry it from rank to coordinator), no load-index data offsets and sidecar checksums of the
// stored bytes; loads on 3 ranks read exact values through both image kinds (a 12 MiB chunk,
// held as head + tail, and small ones, held whole), with and without checksum verification;
// CheckpointReader::read_box reads sub-boxes; objects round trip; decompress_item keeps only
// head and tail of a large item and read_decompressed fills wanted ranges from both; a flipped
// stored byte, a cut item and bytes after the frame each fail with one line naming the item.
#include "engine/compressed_item.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_index.h"
#include "engine/checksum_sidecar.h"
#include "engine/item_reader.h"
#include "format/zstd_writer.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "storage/local_storage.h"
#include "test_util.h"

namespace shardpoint::engine {
namespace {

constexpr std::int64_t kRows = 3072, kCols = 2048;  // 24 MiB of float32: 12 MiB per rank

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(30)}; }

float value_at(std::int64_t i) { return static_cast<float>(i % 1000) * 0.5f; }

struct ZstdCheckpoint {
  shardpoint::testing::TempDir dir;
  std::shared_ptr<storage::Storage> st;
  std::vector<float> full = std::vector<float>(static_cast<std::size_t>(kRows * kCols));
  std::vector<double> small = {1.5, -2.0, 3.25};

  ZstdCheckpoint() {
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = value_at(static_cast<std::int64_t>(i));
    st = storage::open_local_storage_at(dir.path().string());
    SaveOptions so;
    so.compression = Compression::kZstd;
    comm::ThreadGroup two(2, fast());
    two.run([&](comm::Communicator& comm) {
      const std::int64_t r = comm.rank(), rows = kRows / 2;
      TensorShard w;
      w.global_shape = {kRows, kCols};
      w.offsets = {r * rows, 0};
      w.sizes = {rows, kCols};
      w.data = std::as_writable_bytes(std::span<float>(full).subspan(static_cast<std::size_t>(r * rows * kCols),
                                                                     static_cast<std::size_t>(rows * kCols)));
      TensorShard b;
      b.dtype = DType::kFloat64;
      b.global_shape = b.sizes = {3};
      b.offsets = {0};
      b.data = std::as_writable_bytes(std::span<double>(small));
      StateNode root(StateDict{});
      root.set("w", StateNode(w));
      root.set("b", StateNode(b));
      root.set("epoch", StateNode(pickle::Value::integer(7)));
      save(root, *st, comm, so);
    });
  }

  // Loads rows [row0, row0 + rows) of w on each rank and checks them, and b and epoch.
  std::vector<std::exception_ptr> load_rows(const std::vector<std::pair<std::int64_t, std::int64_t>>& boxes,
                                            bool verify = true) {
    comm::ThreadGroup group(static_cast<int>(boxes.size()), fast());
    return group.run_all([&](comm::Communicator& comm) {
      const auto [row0, rows] = boxes[static_cast<std::size_t>(comm.rank())];
      std::vector<float> got(static_cast<std::size_t>(rows * kCols), -1.0f);
      std::vector<double> got_b(3, 0.0);
      TensorShard d;
      d.global_shape = {kRows, kCols};
      d.offsets = {row0, 0};
      d.sizes = {rows, kCols};
      d.data = std::as_writable_bytes(std::span<float>(got));
      TensorShard db;
      db.dtype = DType::kFloat64;
      db.global_shape = db.sizes = {3};
      db.offsets = {0};
      db.data = std::as_writable_bytes(std::span<double>(got_b));
      StateNode tmpl(StateDict{});
      tmpl.set("w", StateNode(d));
      tmpl.set("b", StateNode(db));
      tmpl.set("epoch", StateNode(pickle::Value::integer(0)));
      LoadOptions lo;
      lo.verify_checksums = verify;
      load(tmpl, *st, comm, lo);
      EXPECT_EQ(std::memcmp(got.data(), full.data() + row0 * kCols, got.size() * 4), 0) << "rank " << comm.rank();
      EXPECT_EQ(got_b, small);
      EXPECT_EQ(tmpl.find("epoch")->object()->as_int(), 7);
    });
  }

  format::StorageInfo info_of(const std::string& fqn, const std::optional<Shape>& offset) const {
    return read_metadata(*st).storage_data.at(format::MetadataIndex{fqn, offset, std::nullopt});
  }
  std::shared_ptr<const ByteSource> file_of(const format::StorageInfo& info) const {
    return FileSource::open(dir.file(info.relative_path));
  }
};

std::vector<std::pair<std::int64_t, std::int64_t>> three_way() { return {{0, 1024}, {1024, 1024}, {2048, 1024}}; }

TEST(CompressedItemTest, SavedItemsAreZstdWithStoredByteChecksumsAndNoDataOffsets) {
  ZstdCheckpoint ck;
  const format::Metadata md = read_metadata(*ck.st);
  ASSERT_EQ(md.storage_data.size(), 4u);  // w's 2 chunks; b and epoch once (replicated, deduplicated)
  std::uint64_t stored = 0;
  for (const auto& [index, info] : md.storage_data) {
    EXPECT_EQ(info.transform_descriptors, std::vector<std::string>{"stream.zstd/1"}) << index.fqn;
    if (index.fqn == "w") stored += info.length;
  }
  // 0..999 * 0.5 repeating compresses well.
  EXPECT_LT(stored, static_cast<std::uint64_t>(kRows * kCols * 4) / 4);
  const CheckpointIndex index =
      decode_checkpoint_index(*ck.st->try_read_all(kIndexKey), ck.st->describe_key(kIndexKey));
  EXPECT_TRUE(index.data_offsets.empty());
  ASSERT_TRUE(index.checksums.has_value());
  const format::StorageInfo w0 = ck.info_of("w", Shape{0, 0});
  const ItemChecksums* sums = index.checksums->find(w0.relative_path, w0.offset);
  ASSERT_NE(sums, nullptr);
  EXPECT_EQ(sums->length, w0.length);  // the stored (compressed) bytes
}

TEST(CompressedItemTest, LoadsExactValuesOnMoreRanksWithAndWithoutVerification) {
  ZstdCheckpoint ck;
  for (const bool verify : {true, false}) {
    for (const auto& e : ck.load_rows(three_way(), verify)) EXPECT_FALSE(e);
  }
  for (const auto& e : ck.load_rows({{0, kRows}})) EXPECT_FALSE(e);
}

TEST(CompressedItemTest, ReaderReadsSubBoxes) {
  ZstdCheckpoint ck;
  CheckpointReader reader(*ck.st);
  // A box across the two chunks, and one near the end of the second (past its image's hole).
  for (const auto& [row0, col0, rows, cols] :
       std::vector<std::array<std::int64_t, 4>>{{1500, 7, 100, 300}, {kRows - 3, kCols - 5, 3, 5}, {0, 0, 1, kCols}}) {
    std::vector<float> got(static_cast<std::size_t>(rows * cols));
    reader.read_box("w", {row0, col0}, {rows, cols}, std::as_writable_bytes(std::span<float>(got)));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(got[static_cast<std::size_t>(r * cols + c)], value_at((row0 + r) * kCols + col0 + c))
            << row0 + r << "," << col0 + c;
      }
    }
  }
  EXPECT_EQ(reader.read_object("epoch")->as_int(), 7);
}

TEST(CompressedItemTest, LargeItemsKeepHeadAndTailAndSecondPassFillsRanges) {
  ZstdCheckpoint ck;
  const format::StorageInfo info = ck.info_of("w", Shape{0, 0});
  DecompressOptions options;
  options.max_bytes = std::uint64_t{64} << 20;
  options.keep_whole_bytes = std::uint64_t{8} << 20;
  const DecompressedItem image = decompress_item(ck.file_of(info), info, "w", options);
  ASSERT_TRUE(image.hole.has_value());
  const std::uint64_t size = image.image->size();
  EXPECT_GT(size, static_cast<std::uint64_t>(kRows / 2 * kCols * 4));
  EXPECT_EQ(image.hole->offset, std::uint64_t{64} << 10);
  EXPECT_LE(size - (image.hole->offset + image.hole->size), std::uint64_t{2} << 20);
  std::vector<std::byte> in_hole(16);
  EXPECT_THROW(image.image->read(image.hole->offset + 100, in_hole, "test"), FormatError);

  // Whole: the same bytes, and the CRC-32 of the hole matches the one taken in passing.
  options.keep_whole_bytes = options.max_bytes;
  const DecompressedItem whole = decompress_item(ck.file_of(info), info, "w", options);
  ASSERT_FALSE(whole.hole.has_value());
  ASSERT_EQ(whole.image->size(), size);
  EXPECT_EQ(decompressed_crc32(image, 0, size), decompressed_crc32(whole, 0, size));
  EXPECT_EQ(decompressed_crc32(image, 1000, size - 10), decompressed_crc32(whole, 1000, size - 10));
  EXPECT_EQ(decompressed_crc32(image, image.hole->offset + 10, size), std::nullopt);  // part of the hole
  std::vector<std::byte> a(4096), b(4096), c(100);
  const std::uint64_t near_end = size - 200;
  const WantedRange wanted[] = {
      {5000, a.size(), a.data()}, {image.hole->offset + 777, b.size(), b.data()}, {near_end, c.size(), c.data()}};
  read_decompressed(ck.file_of(info), info, "w", image, wanted, /*to_end=*/false);
  for (const WantedRange& r : wanted) {
    std::vector<std::byte> want(r.length);
    whole.image->read(r.at, want, "test");
    EXPECT_EQ(std::memcmp(r.out, want.data(), r.length), 0) << r.at;
  }
}

// Rewrites the stored bytes of `info` in place (same length) or appends them elsewhere.
void patch_file(const std::string& path, std::uint64_t at, std::string_view bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void expect_one_line_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << p << " in: " << what;
  }
}

TEST(CompressedItemTest, DamagedFramesFailWithOneLine) {
  ZstdCheckpoint ck;
  const format::StorageInfo info = ck.info_of("w", Shape{0, 0});
  CheckpointReaderOptions no_sidecar;
  no_sidecar.verify_checksums = false;  // the frame's own checks, not the sidecar's
  std::vector<float> row(static_cast<std::size_t>(kCols));
  auto read_row = [&] {
    CheckpointReader reader(*ck.st, no_sidecar);
    reader.read_box("w", {0, 0}, {1, kCols}, std::as_writable_bytes(std::span<float>(row)));
  };
  // A byte in the middle of the frame: the frame checksum or block decoding refuses it.
  const std::string path = ck.dir.file(info.relative_path);
  std::string original(1, '\0');
  {
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(info.offset + info.length / 2));
    f.read(original.data(), 1);
  }
  patch_file(path, info.offset + info.length / 2, std::string(1, static_cast<char>(original[0] ^ 0x5a)));
  expect_one_line_error(read_row, {info.relative_path, "\"w\"", "zstd"});
  patch_file(path, info.offset + info.length / 2, original);
  read_row();
  // With the sidecar: the stored bytes' checksum names it too.
  patch_file(path, info.offset + info.length / 2, std::string(1, static_cast<char>(original[0] ^ 0x5a)));
  expect_one_line_error(
      [&] {
        CheckpointReader reader(*ck.st);
        reader.read_box("w", {0, 0}, {1, kCols}, std::as_writable_bytes(std::span<float>(row)));
      },
      {info.relative_path, "\"w\""});
  patch_file(path, info.offset + info.length / 2, original);

  // The item cut short, and the item followed by bytes after its frame (the object is
  // written first in its file, so the next item's bytes follow it).
  const format::StorageInfo epoch = ck.info_of("epoch", std::nullopt);
  for (const std::int64_t delta : {-10, 5}) {
    format::StorageInfo changed = epoch;
    changed.length = static_cast<std::uint64_t>(static_cast<std::int64_t>(epoch.length) + delta);
    DecompressOptions options;
    options.max_bytes = std::uint64_t{64} << 20;
    options.keep_whole_bytes = std::uint64_t{8} << 20;
    expect_one_line_error([&] { (void)decompress_item(ck.file_of(epoch), changed, "item \"epoch\"", options); },
                          {"item \"epoch\"", delta < 0 ? "truncated" : "after it"});
  }
  // A limit below what the frame holds.
  DecompressOptions small;
  small.max_bytes = std::uint64_t{1} << 20;
  small.keep_whole_bytes = 0;
  expect_one_line_error([&] { (void)decompress_item(ck.file_of(info), info, "item \"w\"", small); },
                        {"item \"w\"", "more than 1048576 bytes"});
}

// The first rows*kCols floats of w's first chunk checked in `got` (at row stride `cols`).
void expect_values(const std::vector<float>& got, std::int64_t row0, std::int64_t col0, std::int64_t rows,
                   std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(got[static_cast<std::size_t>(r * cols + c)], value_at((row0 + r) * kCols + col0 + c))
          << row0 + r << "," << col0 + c;
    }
  }
}

TEST(CompressedItemTest, DeliveredRangesAreDecompressedInPlaceWhenLongEnough) {
  ZstdCheckpoint ck;
  const format::StorageInfo info = ck.info_of("w", Shape{0, 0});
  const std::int64_t rows = kRows / 2;
  const std::uint64_t nbytes = static_cast<std::uint64_t>(rows * kCols) * 4, row_bytes = kCols * 4;
  DecompressOptions options;
  options.max_bytes = std::uint64_t{64} << 20;
  options.keep_whole_bytes = options.max_bytes;
  const DecompressedItem whole = decompress_item(ck.file_of(info), info, "w", options);
  const std::uint64_t size = whole.image->size();
  options.keep_whole_bytes = 0;
  options.locate = first_data_record_offset;
  const std::uint64_t base = *first_data_record_offset(*whole.image->view(0, 4096, "test"));

  // The whole chunk: one contiguous range, all but its first and last blocks in place.
  std::vector<float> all(static_cast<std::size_t>(rows * kCols), -1.0f);
  const WantedRange one[] = {{0, nbytes, reinterpret_cast<std::byte*>(all.data())}};
  options.deliver = one;
  DecompressedItem got = decompress_item(ck.file_of(info), info, "w", options);
  EXPECT_EQ(got.delivered_base, base);
  EXPECT_GT(got.in_place_bytes, nbytes - (std::uint64_t{1} << 20));
  EXPECT_EQ(decompressed_crc32(got, 0, size), decompressed_crc32(whole, 0, size));
  expect_values(all, 0, 0, rows, kCols);

  // Two long runs with a gap (rows [0, 500) and [900, rows)): both in place, the second once
  // the window buffer holds a whole window again (up to 2 MiB after the gap).
  std::vector<float> two(static_cast<std::size_t>((rows - 400) * kCols), -1.0f);
  std::byte* out = reinterpret_cast<std::byte*>(two.data());
  const WantedRange gap[] = {{0, 500 * row_bytes, out},
                             {900 * row_bytes, (rows - 900) * row_bytes, out + 500 * row_bytes}};
  options.deliver = gap;
  got = decompress_item(ck.file_of(info), info, "w", options);
  EXPECT_GT(got.in_place_bytes, nbytes - 400 * row_bytes - (std::uint64_t{3} << 20));
  EXPECT_EQ(decompressed_crc32(got, 0, size), decompressed_crc32(whole, 0, size));
  expect_values(std::vector<float>(two.begin(), two.begin() + 500 * kCols), 0, 0, 500, kCols);
  expect_values(std::vector<float>(two.begin() + 500 * kCols, two.end()), 900, 0, rows - 900, kCols);

  // A column box (not contiguous: 50 floats of every row): copied out of the window buffer,
  // and the second pass the same.
  std::vector<float> cols(static_cast<std::size_t>(rows * 50), -1.0f);
  std::vector<WantedRange> strided;
  for (std::int64_t r = 0; r < rows; ++r) {
    strided.push_back(
        {static_cast<std::uint64_t>(r) * row_bytes + 40, 200, reinterpret_cast<std::byte*>(cols.data() + r * 50)});
  }
  options.deliver = strided;
  got = decompress_item(ck.file_of(info), info, "w", options);
  EXPECT_EQ(got.in_place_bytes, 0u);
  EXPECT_EQ(decompressed_crc32(got, 0, size), decompressed_crc32(whole, 0, size));
  expect_values(cols, 0, 10, rows, 50);
  std::fill(cols.begin(), cols.end(), -1.0f);
  for (WantedRange& r : strided) r.at += base;
  read_decompressed(ck.file_of(info), info, "w", got, strided, /*to_end=*/true);
  expect_values(cols, 0, 10, rows, 50);
  // And the whole chunk from the second pass, in place.
  std::fill(all.begin(), all.end(), -1.0f);
  const WantedRange again[] = {{base, nbytes, reinterpret_cast<std::byte*>(all.data())}};
  read_decompressed(ck.file_of(info), info, "w", got, again, /*to_end=*/true);
  expect_values(all, 0, 0, rows, kCols);
}

// A ReadItem of the whole first chunk of w into a box of its size.
ReadItem whole_first_chunk() {
  ReadItem item;
  item.type = ReadItemType::kTensor;
  item.dest_index = format::MetadataIndex{"w", Shape{0, 0}, std::nullopt};
  item.dest_offsets = item.storage_offsets = {0, 0};
  item.storage_index = format::MetadataIndex{"w", Shape{0, 0}, 0};
  item.lengths = {kRows / 2, kCols};
  return item;
}

// Counts the bytes read through it.
class CountingSource final : public ByteSource {
 public:
  explicit CountingSource(std::shared_ptr<const ByteSource> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t size() const override { return inner_->size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    bytes_read += out.size();
    inner_->read(offset, out, what);
  }
  mutable std::uint64_t bytes_read = 0;

 private:
  std::shared_ptr<const ByteSource> inner_;
};

TEST(CompressedItemTest, AChunkReadWholeIsDecompressedOnceStraightIntoItsDestination) {
  ZstdCheckpoint ck;
  const format::StorageInfo info = ck.info_of("w", Shape{0, 0});
  const CheckpointIndex index =
      decode_checkpoint_index(*ck.st->try_read_all(kIndexKey), ck.st->describe_key(kIndexKey));
  for (const bool verify : {false, true}) {
    BlobChecksums checksums;
    if (verify) {
      checksums.algorithm = index.checksums->algorithm();
      checksums.item = index.checksums->find(info.relative_path, info.offset);
    }
    auto file = std::make_shared<CountingSource>(ck.file_of(info));
    std::vector<float> got(static_cast<std::size_t>(kRows / 2 * kCols), -1.0f);
    SavedTensorBlob blob(file, info, "w", {{0, 0}, {kRows / 2, kCols}}, DType::kFloat32, std::nullopt,
                         /*defer_transformed=*/true);
    blob.read_into(whole_first_chunk(), std::as_writable_bytes(std::span<float>(got)), {kRows / 2, kCols}, checksums);
    EXPECT_EQ(file->bytes_read, info.length) << verify;  // one pass over the stored bytes
    expect_values(got, 0, 0, kRows / 2, kCols);
  }
}

TEST(CompressedItemTest, FramesOfMoreOrFewerBytesThanTheItemAreRefused) {
  ZstdCheckpoint ck;
  const format::StorageInfo info = ck.info_of("w", Shape{0, 0});
  DecompressOptions options;
  options.max_bytes = options.keep_whole_bytes = std::uint64_t{64} << 20;
  const std::shared_ptr<const ByteSource> image = decompress_item(ck.file_of(info), info, "w", options).image;
  const std::string blob = image->read_string(0, image->size(), "test");
  const format::ChunkStorageMetadata chunk{{0, 0}, {kRows / 2, kCols}};
  const ReadItem item = whole_first_chunk();
  std::vector<float> dest(static_cast<std::size_t>(kRows / 2 * kCols));
  const std::span<std::byte> out = std::as_writable_bytes(std::span<float>(dest));
  // The blob with bytes after its zip archive, cut inside its central directory, cut inside
  // its tensor data, and a blob of another item (3 float64s): each read at open and in passing.
  const format::StorageInfo b = ck.info_of("b", Shape{0});
  const std::shared_ptr<const ByteSource> other = decompress_item(ck.file_of(b), b, "b", options).image;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {blob + std::string(100, 'x'), "100 bytes after the end of its zip archive"},
      {blob.substr(0, blob.size() - 100), "does not end with a zip end record"},
      {blob.substr(0, blob.size() / 2), "does not end with a zip end record"},
      {other->read_string(0, other->size(), "test"), "expected dtype float32"}};
  for (const auto& [bytes, message] : cases) {
    StringSink stored;
    format::ZstdWriter writer(stored, 1);
    writer.write(as_bytes(bytes));
    writer.finish();
    auto file = std::make_shared<MemorySource>(as_bytes(stored.str()), "__0_0.distcp");
    const format::StorageInfo lying{"__0_0.distcp", 0, stored.str().size(), {"stream.zstd/1"}};
    for (const bool deferred : {true, false}) {
      expect_one_line_error(
          [&] {
            SavedTensorBlob saved(file, lying, "w", chunk, DType::kFloat32, std::nullopt, deferred);
            saved.read_into(item, out, chunk.sizes, BlobChecksums{});
          },
          {"__0_0.distcp", "\"w\"", message});
    }
  }
}

}  // namespace
}  // namespace shardpoint::engine
