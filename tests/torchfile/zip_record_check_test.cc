// check_zip_record(): a clean archive's records match; a flipped data byte is a mismatch
// with the CRCs named; a CRC-32 of 0 in the central directory (PyTorch's compute_crc32 =
// False) is "not recorded", never a mismatch; an empty record matches; local header and
// data descriptor fields that disagree with the central directory are header problems;
// compressed records and check_crc = false compute nothing.
#include "torchfile/zip_record_check.h"

#include <gtest/gtest.h>

#include "core/byte_stream.h"
#include "core/checksum.h"
#include "torchfile/zip_writer.h"

namespace shardpoint::torchfile {
namespace {

std::string archive_bytes(bool force64 = false) {
  StringSink sink;
  ZipWriter w(sink, {.force_zip64 = force64});
  w.write_record("a/data.pkl", std::string(300, 'p'));
  w.write_record("a/data/0", std::string(1000, 'd'));
  w.write_record("a/empty", std::string());
  w.finish();
  return sink.str();
}

struct Checked {
  std::vector<RecordCheck> records;
};

Checked check_all(const std::string& bytes, bool check_crc = true, std::size_t scratch_bytes = 64) {
  MemorySource source(as_bytes(bytes), "z.zip");
  ZipArchive archive(source);
  std::vector<std::byte> scratch(scratch_bytes);
  Checked out;
  for (const auto& e : archive.entries()) out.records.push_back(check_zip_record(archive, e, check_crc, scratch));
  return out;
}

const ZipEntry& entry(const std::string& bytes, const std::string& name, std::unique_ptr<MemorySource>& keep,
                      std::unique_ptr<ZipArchive>& archive) {
  keep = std::make_unique<MemorySource>(as_bytes(bytes), "z.zip");
  archive = std::make_unique<ZipArchive>(*keep);
  return *archive->find(name);
}

TEST(ZipRecordCheck, CleanArchiveMatches) {
  for (bool force64 : {false, true}) {
    const std::string z = archive_bytes(force64);
    Checked c = check_all(z);
    ASSERT_EQ(c.records.size(), 3u);
    for (const auto& r : c.records) {
      EXPECT_EQ(r.crc, RecordCrc::kMatch);
      EXPECT_EQ(r.expected, r.found);
      EXPECT_TRUE(r.header_problems.empty()) << r.header_problems.front();
    }
    EXPECT_EQ(c.records[1].found, crc32(0, as_bytes(std::string(1000, 'd'))));
    EXPECT_EQ(c.records[2].found, 0u);  // empty: CRC 0, a match
  }
}

TEST(ZipRecordCheck, FlippedDataByteIsAMismatch) {
  std::string z = archive_bytes();
  std::unique_ptr<MemorySource> src;
  std::unique_ptr<ZipArchive> ar;
  const ZipEntry e = entry(z, "a/data/0", src, ar);
  z[static_cast<std::size_t>(e.data_offset + 999)] ^= 0x10;
  Checked c = check_all(z);
  EXPECT_EQ(c.records[0].crc, RecordCrc::kMatch);
  EXPECT_EQ(c.records[1].crc, RecordCrc::kMismatch);
  EXPECT_EQ(c.records[1].expected, crc32(0, as_bytes(std::string(1000, 'd'))));
  EXPECT_NE(c.records[1].found, c.records[1].expected);
  EXPECT_EQ(c.records[1].data, (ByteRange{e.data_offset, 1000}));
  EXPECT_TRUE(c.records[1].header_problems.empty());
}

TEST(ZipRecordCheck, ZeroCrcIsNotRecorded) {
  std::string z = archive_bytes();
  std::unique_ptr<MemorySource> src;
  std::unique_ptr<ZipArchive> ar;
  const ZipEntry e = entry(z, "a/data/0", src, ar);
  // As PyTorch writes it without computing: 0 in the descriptor and the central directory.
  const std::size_t dd = static_cast<std::size_t>(e.data_offset + e.uncompressed_size);
  z.replace(dd + 4, 4, std::string(4, '\0'));
  std::size_t at = z.find(std::string("PK\x01\x02", 4));
  while (at != std::string::npos && z.compare(at + 46, 8, "a/data/0") != 0)
    at = z.find(std::string("PK\x01\x02", 4), at + 1);
  ASSERT_NE(at, std::string::npos);
  z.replace(at + 16, 4, std::string(4, '\0'));
  Checked c = check_all(z);
  EXPECT_EQ(c.records[1].crc, RecordCrc::kNotRecorded);
  EXPECT_EQ(c.records[1].expected, 0u);
  EXPECT_TRUE(c.records[1].header_problems.empty()) << c.records[1].header_problems.front();
  EXPECT_EQ(c.records[0].crc, RecordCrc::kMatch);
}

TEST(ZipRecordCheck, HeaderFieldsThatDisagreeAreProblems) {
  const std::string clean = archive_bytes();
  std::unique_ptr<MemorySource> src;
  std::unique_ptr<ZipArchive> ar;
  const ZipEntry e = entry(clean, "a/data/0", src, ar);
  struct Case {
    std::uint64_t at;
    const char* needle;
  };
  const std::size_t dd = static_cast<std::size_t>(e.data_offset + e.uncompressed_size);
  for (const Case& k :
       {Case{e.local_header_offset + 6, "expected flags"}, Case{e.local_header_offset + 8, "expected method"},
        Case{e.local_header_offset + 14, "expected CRC-32"}, Case{e.local_header_offset + 22, "expected size"},
        Case{dd + 4, "zip data descriptor of \"a/data/0\""}, Case{dd + 8, "expected sizes"}}) {
    std::string z = clean;
    z[static_cast<std::size_t>(k.at)] ^= 0x01;
    Checked c = check_all(z);
    ASSERT_EQ(c.records[1].header_problems.size(), 1u) << k.needle;
    EXPECT_NE(c.records[1].header_problems[0].find(k.needle), std::string::npos) << c.records[1].header_problems[0];
    EXPECT_EQ(c.records[1].crc, RecordCrc::kMatch) << k.needle;  // the data itself is intact
  }
}

TEST(ZipRecordCheck, CheckCrcFalseComputesNothing) {
  Checked c = check_all(archive_bytes(), false);
  for (const auto& r : c.records) EXPECT_EQ(r.crc, RecordCrc::kNotChecked);
}

TEST(ZipRecordCheck, Crc32Hex) { EXPECT_EQ(crc32_hex(0x1a2b3c), "001a2b3c"); }

}  // namespace
}  // namespace shardpoint::torchfile
