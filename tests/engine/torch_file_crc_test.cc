// TorchFileCrc: the zip CRC-32 checks of reads from one torch.save file. The small records
// are checked at open; a contiguous tensor's reads in any order check its storage record
// once they cover it; a view of part of a storage stays partial; a strided tensor's record
// is checked whole, once; a mismatch names file, tensor, record and byte range; a record
// stored without a CRC-32 is "no checksum"; a damaged data.pkl that does not parse is named
// by its CRC-32.
#include "engine/torch_file_crc.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardpoint/error.h"
#include "torchfile/torch_save_writer.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {
namespace {

using pickle::Value;
using pickle::ValuePtr;

constexpr std::int64_t kBigNumel = 100000;  // 400,000 bytes: more than one kCrcReadBytes

std::string pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// {"w": float32 [kBigNumel] (storage "big"), "row": float32 [6] viewing elements 6..11 of
// storage "s" (24 elements), "t": float32 [4, 6] transposed over storage "t", "tag": "run-1"}.
std::string build_file() {
  const std::vector<std::int64_t> big{kBigNumel}, big_strides{1}, row{6}, row_strides{1}, t{4, 6}, t_strides{1, 4};
  pickle::DictEntries entries;
  entries.emplace_back(Value::str("w"), torchfile::make_tensor_node(DType::kFloat32, big, big_strides, 0, "big",
                                                                    static_cast<std::uint64_t>(kBigNumel)));
  entries.emplace_back(Value::str("row"), torchfile::make_tensor_node(DType::kFloat32, row, row_strides, 6, "s", 24));
  entries.emplace_back(Value::str("t"), torchfile::make_tensor_node(DType::kFloat32, t, t_strides, 0, "t", 24));
  entries.emplace_back(Value::str("tag"), Value::str("run-1"));
  StringSink sink;
  torchfile::TorchSaveWriter writer(sink);
  writer.write_pickle(*Value::dict(std::move(entries)));
  writer.write_storage("big", as_bytes(pattern(static_cast<std::size_t>(kBigNumel) * 4, 1)));
  writer.write_storage("s", as_bytes(pattern(96, 2)));
  writer.write_storage("t", as_bytes(pattern(96, 3)));
  writer.finish();
  return sink.take();
}

std::unique_ptr<torchfile::TorchFile> open(const std::string& bytes) {
  return torchfile::TorchFile::open(std::make_unique<MemorySource>(as_bytes(bytes), "f.pt"));
}

const torchfile::TensorInfo& tensor(const torchfile::TorchFile& f, const std::string& key) {
  return *f.tensor_of(*f.root()->get(key));
}

// Reads all of tensor `key` (contiguous) in two pieces, the second half first.
void read_in_halves(TorchFileCrc& crc, const torchfile::TorchFile& f, const std::string& key) {
  const torchfile::TensorInfo& info = tensor(f, key);
  const std::uint64_t at = info.storage.offset + static_cast<std::uint64_t>(info.storage_offset) * 4;
  std::vector<std::byte> out(info.nbytes());
  const std::size_t half = out.size() / 2;
  crc.read(info, key, at + half, std::span(out).subspan(half), "test");
  crc.read(info, key, at, std::span(out).first(half), "test");
}

// Sets the CRC-32 of record `name` to 0 in the central directory and the data descriptor,
// as PyTorch writes a record whose CRC it did not compute.
std::string without_crc(std::string bytes, const std::string& name) {
  const MemorySource source(as_bytes(bytes), "f.pt");
  const torchfile::ZipArchive archive(source);
  const torchfile::ZipEntry& e = *archive.find(name);
  bytes.replace(static_cast<std::size_t>(e.data_offset + e.compressed_size + 4), 4, std::string(4, '\0'));
  for (std::size_t at = bytes.find(std::string("PK\x01\x02", 4)); at != std::string::npos;
       at = bytes.find(std::string("PK\x01\x02", 4), at + 1)) {
    if (bytes.compare(at + 46, name.size(), name) == 0) bytes.replace(at + 16, 4, std::string(4, '\0'));
  }
  return bytes;
}

TEST(TorchFileCrc, SmallRecordsAtOpenAndPiecesInAnyOrder) {
  const std::string bytes = build_file();
  auto f = open(bytes);
  TorchFileCrc crc(*f, "f.pt");
  crc.check_small_records();
  const ZipCrcCounts small = crc.counts();
  EXPECT_EQ(small.records_checked, 4u);  // data.pkl, byteorder, version, .data/serialization_id
  EXPECT_EQ(small.records_partial, 0u);
  read_in_halves(crc, *f, "w");
  const ZipCrcCounts c = crc.counts();
  EXPECT_EQ(c.records_checked, 5u);
  EXPECT_EQ(c.bytes_checked, small.bytes_checked + kBigNumel * 4);
  EXPECT_EQ(c.records_partial, 0u);
}

TEST(TorchFileCrc, PartOfAStorageIsPartialAndStridedIsCheckedWholeOnce) {
  const std::string bytes = build_file();
  auto f = open(bytes);
  TorchFileCrc crc(*f, "f.pt");
  read_in_halves(crc, *f, "row");
  EXPECT_EQ(crc.counts().records_partial, 1u);
  EXPECT_EQ(crc.counts().records_checked, 0u);
  crc.check_storage(tensor(*f, "t"), "t");
  crc.check_storage(tensor(*f, "t"), "t");
  EXPECT_EQ(crc.counts().records_checked, 1u);
  EXPECT_EQ(crc.counts().bytes_checked, 96u);
  // The whole record in one piece checks it, whatever pieces came before.
  crc.check_storage(tensor(*f, "row"), "row");
  EXPECT_EQ(crc.counts().records_partial, 0u);
  EXPECT_EQ(crc.counts().records_checked, 2u);
}

TEST(TorchFileCrc, MismatchNamesFileTensorRecordAndRange) {
  std::string bytes = build_file();
  std::uint64_t begin = 0;
  {
    auto f = open(bytes);
    begin = tensor(*f, "w").storage.offset;
  }
  bytes[static_cast<std::size_t>(begin + 300000)] ^= 0x04;
  auto f = open(bytes);
  TorchFileCrc crc(*f, "f.pt");
  crc.check_small_records();
  try {
    read_in_halves(crc, *f, "w");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("f.pt: tensor \"w\": zip record \"archive/data/big\" (file bytes [" + std::to_string(begin) +
                          ", " + std::to_string(begin + kBigNumel * 4) + ")): CRC-32 mismatch: expected ",
                      0),
              0u)
        << m;
  }
}

TEST(TorchFileCrc, RecordWithoutCrcIsNoChecksum) {
  std::string bytes = without_crc(without_crc(build_file(), "archive/data/big"), "archive/data.pkl");
  auto f = open(bytes);
  TorchFileCrc crc(*f, "f.pt");
  crc.check_small_records();
  read_in_halves(crc, *f, "w");
  const ZipCrcCounts c = crc.counts();
  EXPECT_EQ(c.records_no_checksum, 2u);
  EXPECT_EQ(c.records_checked, 3u);
}

TEST(TorchFileCrc, SmallRecordMismatchNamesTheRecord) {
  std::string bytes = build_file();
  const std::size_t at = bytes.find("run-1");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 'R';  // the pickle still parses
  auto f = open(bytes);
  TorchFileCrc crc(*f, "f.pt");
  try {
    crc.check_small_records();
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("f.pt: zip record \"archive/data.pkl\" (file bytes [", 0), 0u) << e.what();
  }
}

TEST(TorchFileCrc, OpenNamesADamagedDataPklByItsCrc) {
  std::string bytes = build_file();
  const std::size_t at = bytes.find("run-1");
  ASSERT_NE(at, std::string::npos);
  bytes[at - 2] = '\xee';  // the string's opcode: the pickle no longer parses
  auto source = [&]() -> std::unique_ptr<ByteSource> {
    return std::make_unique<MemorySource>(as_bytes(bytes), "f.pt");
  };
  try {
    open_torch_file_naming_crc(source, "f.pt", true);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("f.pt: zip record \"archive/data.pkl\" (file bytes [", 0), 0u) << m;
    EXPECT_NE(m.find("CRC-32 mismatch"), std::string::npos) << m;
  }
  try {
    open_torch_file_naming_crc(source, "f.pt", false);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
  }
  const std::string clean = build_file();
  EXPECT_NE(open_torch_file_naming_crc([&] { return std::make_unique<MemorySource>(as_bytes(clean), "g"); }, "g", true),
            nullptr);
}

}  // namespace
}  // namespace shardpoint::engine
