#include "format/distcp_item.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "core/byte_stream.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"
#include "test_util.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::format {
namespace {

using pickle::Value;
using shardpoint::testing::read_text;
using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;
using shardpoint::testing::write_text;

// torch.save of a float32 tensor of `shape` holding 0, 1, 2, ...
std::string tensor_blob(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i);
  StringSink sink;
  torchfile::TorchSaveWriter w(sink);
  auto strides = torchfile::contiguous_strides(shape);
  w.write_pickle(*torchfile::make_tensor_node(DType::kFloat32, shape, strides, 0, "0", static_cast<std::uint64_t>(n)));
  w.write_storage("0", std::as_bytes(std::span(values)));
  w.finish();
  return sink.take();
}

// torch.save of {"lr": 0.5, "step": 7}.
std::string object_blob() {
  StringSink sink;
  torchfile::TorchSaveWriter w(sink);
  pickle::DictEntries e;
  e.emplace_back(Value::str("lr"), Value::floating(0.5));
  e.emplace_back(Value::str("step"), Value::integer(7));
  w.write_pickle(*Value::dict(std::move(e)));
  w.finish();
  return sink.take();
}

std::string zstd_compress(const std::string& data, bool with_content_size) {
  if (with_content_size) {
    std::string out(ZSTD_compressBound(data.size()), '\0');
    std::size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
  }
  // Streaming, as python-zstandard's stream_writer: no content size in the frame header.
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
  std::string out(ZSTD_compressBound(data.size()) + 64, '\0');
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  std::size_t rest = 0;
  do {
    rest = ZSTD_compressStream2(c, &o, &in, ZSTD_e_end);
    EXPECT_FALSE(ZSTD_isError(rest));
  } while (rest != 0);
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  EXPECT_EQ(ZSTD_getFrameContentSize(out.data(), out.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  return out;
}

// A .distcp image: 13 bytes of junk, a tensor blob, an object blob (no padding between).
struct Distcp {
  std::string bytes;
  StorageInfo tensor;
  StorageInfo object;
};

Distcp make_distcp() {
  Distcp d;
  d.bytes = "junk-prefix!!";
  std::string t = tensor_blob({3, 4});
  std::string o = object_blob();
  d.tensor = {"__0_0.distcp", d.bytes.size(), t.size(), {}};
  d.bytes += t;
  d.object = {"__0_0.distcp", d.bytes.size(), o.size(), {}};
  d.bytes += o;
  return d;
}

void expect_tensor_item(const DistcpItem& item, const std::string& file_bytes) {
  const torchfile::TensorInfo& t = item.tensor();
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{3, 4}));
  std::vector<float> values(12);
  item.torch_file().read_tensor(t, std::as_writable_bytes(std::span(values)));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(values[i], static_cast<float>(i));
  if (!item.transformed()) {
    std::optional<torchfile::ByteRange> r = item.storage_range_in_file(t);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->size, 48u);
    ASSERT_LE(r->offset + r->size, file_bytes.size());
    EXPECT_EQ(std::memcmp(file_bytes.data() + r->offset, values.data(), 48), 0);
  } else {
    EXPECT_FALSE(item.storage_range_in_file(t).has_value());
  }
}

void expect_object_item(const DistcpItem& item) {
  const pickle::ValuePtr& obj = item.object();
  ASSERT_TRUE(obj && obj->is(pickle::Kind::kDict));
  EXPECT_EQ(obj->get("lr")->as_float(), 0.5);
  EXPECT_EQ(obj->get("step")->as_int(), 7);
}

TEST(DistcpItemTest, OpensItemsOfEverySourceKind) {
  Distcp d = make_distcp();
  TempDir dir;
  write_text(dir.file("__0_0.distcp"), d.bytes);
  std::vector<std::shared_ptr<const ByteSource>> sources = {
      std::make_shared<MemorySource>(as_bytes(d.bytes), "mem/__0_0.distcp"), FileSource::open(dir.file("__0_0.distcp")),
      MappedSource::open(dir.file("__0_0.distcp"))};
  for (const auto& src : sources) {
    SCOPED_TRACE(src->name());
    auto t = DistcpItem::open(src, d.tensor, "model.w");
    EXPECT_EQ(t->fqn(), "model.w");
    EXPECT_FALSE(t->transformed());
    expect_tensor_item(*t, d.bytes);
    auto o = DistcpItem::open(src, d.object, "extra");
    expect_object_item(*o);
  }
}

TEST(DistcpItemTest, MappedItemsAreZeroCopyAndOutliveTheirFileSource) {
  Distcp d = make_distcp();
  TempDir dir;
  write_text(dir.file("f.distcp"), d.bytes);
  std::shared_ptr<const ByteSource> src = MappedSource::open(dir.file("f.distcp"));
  auto item = DistcpItem::open(src, d.tensor, "model.w");
  src.reset();  // the item's window keeps the mapping alive
  const auto& t = item->tensor();
  std::optional<ByteSpan> view = item->torch_file().storage_view(t);
  ASSERT_TRUE(view.has_value());
  float first[2];
  std::memcpy(first, view->data(), sizeof first);
  EXPECT_EQ(first[1], 1.0f);
}

TEST(DistcpItemTest, ZstdTransformIsUndone) {
  for (bool content_size : {true, false}) {
    Distcp d = make_distcp();
    std::string blob = d.bytes.substr(d.tensor.offset, d.tensor.length);
    std::string z = zstd_compress(blob, content_size);
    std::string file = "xx" + z;
    StorageInfo info{"__0_0.distcp", 2, z.size(), {"stream.zstd/1"}};
    auto src = std::make_shared<MemorySource>(as_bytes(file), "z.distcp");
    auto item = DistcpItem::open(src, info, "model.w");
    EXPECT_TRUE(item->transformed());
    expect_tensor_item(*item, file);
    EXPECT_EQ(read_item_bytes(*src, info, "model.w"), blob);
  }
}

std::string open_error(const std::string& file, const StorageInfo& info, const ItemOptions& options = {}) {
  auto src = std::make_shared<MemorySource>(as_bytes(file), "f.distcp");
  try {
    DistcpItem::open(src, info, "model.w", options);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DistcpItemTest, ZstdLimitsAndCorruption) {
  Distcp d = make_distcp();
  std::string blob = d.bytes.substr(d.tensor.offset, d.tensor.length);
  for (bool content_size : {true, false}) {
    std::string z = zstd_compress(blob, content_size);
    StorageInfo info{"f", 0, z.size(), {"stream.zstd/1"}};
    ItemOptions small{.max_decompressed_bytes = blob.size() - 1};
    EXPECT_NE(open_error(z, info, small).find("more than the limit of " + std::to_string(blob.size() - 1)),
              std::string::npos);
    ItemOptions exact{.max_decompressed_bytes = blob.size()};
    EXPECT_EQ(open_error(z, info, exact), "(no error)");
    // Truncated stream.
    StorageInfo cut{"f", 0, z.size() - 5, {"stream.zstd/1"}};
    EXPECT_NE(open_error(z, cut).find("zstd"), std::string::npos);
    // Corrupted body.
    std::string bad = z;
    for (std::size_t i = 12; i < bad.size(); i += 7) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    std::string msg = open_error(bad, info);
    EXPECT_NE(msg, "(no error)");
  }
  // Not zstd at all.
  StorageInfo info{"f", 0, blob.size(), {"stream.zstd/1"}};
  EXPECT_NE(open_error(blob, info).find("expected a zstd frame (magic 28 b5 2f fd), found 50 4b 03 04"),
            std::string::npos);
  // A bomb: 64 MiB of zeros in a few KiB, limit 1 MiB.
  std::string zeros(std::size_t{64} << 20, '\0');
  std::string z = zstd_compress(zeros, false);
  StorageInfo bomb{"f", 0, z.size(), {"stream.zstd/1"}};
  EXPECT_NE(open_error(z, bomb, ItemOptions{.max_decompressed_bytes = 1 << 20}).find("more than the limit"),
            std::string::npos);
}

TEST(DistcpItemTest, UnknownTransformIsRefused) {
  Distcp d = make_distcp();
  StorageInfo info = d.tensor;
  info.transform_descriptors = {"stream.lz4/1"};
  EXPECT_EQ(open_error(d.bytes, info), "unknown transform 'stream.lz4/1' on item 'model.w'");
  auto src = std::make_shared<MemorySource>(as_bytes(d.bytes), "f.distcp");
  EXPECT_THROW(read_item_bytes(*src, info, "model.w"), FormatError);
}

TEST(DistcpItemTest, RangeAndContentErrorsNameTheItem) {
  Distcp d = make_distcp();
  StorageInfo past = d.object;
  past.length += 1;
  EXPECT_EQ(open_error(d.bytes, past), "f.distcp: item 'model.w' [" + std::to_string(past.offset) + "+" +
                                           std::to_string(past.length) + "]: expected the item inside the file of " +
                                           std::to_string(d.bytes.size()) + " bytes, found it reaching past the end");
  StorageInfo huge{"f", ~std::uint64_t{0}, 10, {}};
  EXPECT_NE(open_error(d.bytes, huge).find("reaching past the end"), std::string::npos);
  // Junk instead of a torch.save archive: TorchFile's error, naming the item's window.
  StorageInfo junk{"f", 0, 13, {}};
  std::string msg = open_error(d.bytes, junk);
  EXPECT_NE(msg.find("item 'model.w'"), std::string::npos) << msg;
  // Off by one: the end records are not where the window ends.
  StorageInfo shifted = d.tensor;
  shifted.offset += 1;
  EXPECT_NE(open_error(d.bytes, shifted), "(no error)");
}

TEST(DistcpItemTest, TensorOfABytesItemIsAFormatError) {
  Distcp d = make_distcp();
  auto src = std::make_shared<MemorySource>(as_bytes(d.bytes), "f.distcp");
  auto item = DistcpItem::open(src, d.object, "extra");
  try {
    item->tensor();
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(
        std::string(e.what()).find("item 'extra': expected a tensor at the root of the torch.save blob, found dict"),
        std::string::npos)
        << e.what();
  }
}

TEST(DistcpItemTest, EveryTruncatedItemLengthIsAnErrorNotACrash) {
  Distcp d = make_distcp();
  auto src = std::make_shared<MemorySource>(as_bytes(d.bytes), "f.distcp");
  for (std::uint64_t n = 0; n < d.tensor.length; ++n) {
    StorageInfo info = d.tensor;
    info.length = n;
    EXPECT_THROW(DistcpItem::open(src, info, "model.w"), FormatError) << n;
  }
}

// Real PyTorch 1.13 checkpoint: every item of __0_0.distcp opens and holds what was saved.
TEST(DistcpItemTest, ReadsEveryItemOfARealTorch113Checkpoint) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  auto r = run_command(python + " " + SP_SOURCE_DIR + "/tests/format/metadata_oracle.py torch113-write " +
                       dir.path().string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string meta_bytes = read_text(dir.file(".metadata"));
  Metadata md = decode_metadata(as_bytes(meta_bytes), ".metadata");
  std::shared_ptr<const ByteSource> file = MappedSource::open(dir.file("__0_0.distcp"));
  int seen = 0;
  for (const auto& [index, info] : md.storage_data) {
    ASSERT_EQ(info.relative_path, "__0_0.distcp");
    auto item = DistcpItem::open(file, info, index.fqn);
    ++seen;
    if (index.fqn == "model.w") {
      const auto& t = item->tensor();
      EXPECT_EQ(t.shape, (std::vector<std::int64_t>{4, 6}));
      std::vector<float> v(24);
      item->torch_file().read_tensor(t, std::as_writable_bytes(std::span(v)));
      for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], static_cast<float>(i));
      auto range = item->storage_range_in_file(t);
      ASSERT_TRUE(range.has_value());
      std::string raw = file->read_string(range->offset, range->size, "check");
      EXPECT_EQ(std::memcmp(raw.data(), v.data(), 96), 0);
    } else if (index.fqn == "model.b") {
      EXPECT_EQ(item->tensor().dtype, DType::kBFloat16);
      EXPECT_EQ(item->tensor().shape, (std::vector<std::int64_t>{6}));
    } else if (index.fqn == "s") {
      const auto& t = item->tensor();
      EXPECT_TRUE(t.shape.empty());
      std::int64_t v = 0;
      item->torch_file().read_tensor(t, std::as_writable_bytes(std::span(&v, 1)));
      EXPECT_EQ(v, 7);
    } else if (index.fqn == "step") {
      EXPECT_EQ(item->object()->as_int(), 5);
    } else if (index.fqn == "nested") {
      ASSERT_TRUE(item->object()->is(pickle::Kind::kDict));
      EXPECT_EQ(item->object()->get("lr")->as_float(), 0.5);
    } else {
      ADD_FAILURE() << "unexpected item " << index.fqn;
    }
  }
  EXPECT_EQ(seen, 5);
}

}  // namespace
}  // namespace shardpoint::format
