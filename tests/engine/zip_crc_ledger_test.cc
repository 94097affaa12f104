// ZipCrcLedger: pieces of a record's data in any order combine into the record's CRC-32;
// a mismatch names file, item, record and byte range; CRC 0 is "no checksum"; a record
// never covered (or covered by overlapping pieces) stays partial, unchecked.
#include "engine/zip_crc_ledger.h"

#include <gtest/gtest.h>

#include <string>

#include "core/byte_io.h"
#include "core/checksum.h"
#include "shardpoint/error.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {
namespace {

std::string data_bytes() {
  std::string s(10000, '\0');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 2654435761u) >> 9);
  return s;
}

DataRecord record_of(const std::string& data, std::uint32_t expected) {
  return DataRecord{
      "__0_0.distcp", 4096, "archive/data/0", 448, data.size(), expected, "__0_0.distcp: item \"w\" chunk [0:10]"};
}

std::uint32_t crc_of(const std::string& s, std::size_t begin, std::size_t end) {
  return crc32(0, as_bytes(std::string_view(s).substr(begin, end - begin)));
}

TEST(ZipCrcLedger, PiecesInAnyOrderCheckTheRecord) {
  const std::string d = data_bytes();
  const DataRecord r = record_of(d, crc_of(d, 0, d.size()));
  ZipCrcLedger ledger;
  ledger.add_piece(r, 7000, 10000, crc_of(d, 7000, 10000));
  ledger.add_piece(r, 0, 3000, crc_of(d, 0, 3000));
  EXPECT_EQ(ledger.counts().records_partial, 1u);
  EXPECT_EQ(ledger.counts().records_checked, 0u);
  ledger.add_piece(r, 3000, 7000, crc_of(d, 3000, 7000));
  const ZipCrcCounts c = ledger.counts();
  EXPECT_EQ(c.records_checked, 1u);
  EXPECT_EQ(c.bytes_checked, d.size());
  EXPECT_EQ(c.records_partial, 0u);
}

TEST(ZipCrcLedger, MismatchNamesFileItemRecordAndRange) {
  std::string d = data_bytes();
  const DataRecord r = record_of(d, crc_of(d, 0, d.size()));
  d[5000] ^= 4;
  ZipCrcLedger ledger;
  ledger.add_piece(r, 0, 5000, crc_of(d, 0, 5000));
  try {
    ledger.add_piece(r, 5000, 10000, crc_of(d, 5000, 10000));
    FAIL() << "no error";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("__0_0.distcp: item \"w\" chunk [0:10]"), std::string::npos) << m;
    EXPECT_NE(m.find("zip record \"archive/data/0\""), std::string::npos) << m;
    EXPECT_NE(m.find("file bytes [4544, 14544)"), std::string::npos) << m;
    EXPECT_NE(m.find("CRC-32 mismatch: expected " + torchfile::crc32_hex(r.expected) + " (central directory), found " +
                     torchfile::crc32_hex(crc_of(d, 0, d.size()))),
              std::string::npos)
        << m;
  }
}

TEST(ZipCrcLedger, ZeroIsNoChecksumAndOverlapsStayPartial) {
  const std::string d = data_bytes();
  ZipCrcLedger ledger;
  DataRecord none = record_of(d, 0);
  ledger.add_piece(none, 0, d.size(), crc_of(d, 0, d.size()));
  DataRecord other = record_of(d, crc_of(d, 0, d.size()));
  other.blob_offset = 99999;
  ledger.add_piece(other, 0, 6000, crc_of(d, 0, 6000));
  ledger.add_piece(other, 5000, 10000, crc_of(d, 5000, 10000));  // overlaps: cannot combine
  ZipCrcCounts partial_ok;
  partial_ok.records_checked = 2;
  partial_ok.bytes_checked = 300;
  ledger.count(partial_ok);
  const ZipCrcCounts c = ledger.counts();
  EXPECT_EQ(c.records_no_checksum, 1u);
  EXPECT_EQ(c.records_partial, 1u);
  EXPECT_EQ(c.records_checked, 2u);
  EXPECT_EQ(c.bytes_checked, 300u);
}

TEST(ZipCrcLedger, AWholePieceChecksWhateverCameBefore) {
  const std::string d = data_bytes();
  const DataRecord r = record_of(d, crc_of(d, 0, d.size()));
  ZipCrcLedger ledger;
  ledger.add_piece(r, 1000, 6000, crc_of(d, 1000, 6000));
  ledger.add_piece(r, 0, d.size(), crc_of(d, 0, d.size()));  // overlaps, but covers it all
  EXPECT_EQ(ledger.counts().records_checked, 1u);
  EXPECT_EQ(ledger.counts().records_partial, 0u);
}

// One torch.save file holds many records read in pieces: each is its own, known by where
// its data starts in the file.
TEST(ZipCrcLedger, RecordsOfOneFileAreKeptApart) {
  const std::string d = data_bytes();
  DataRecord a{"model.pt", 0, "archive/data/0", 64, 5000, crc_of(d, 0, 5000), "model.pt: tensor \"a\""};
  DataRecord b{"model.pt", 0, "archive/data/1", 5120, 5000, crc_of(d, 5000, 10000), "model.pt: tensor \"b\""};
  ZipCrcLedger ledger;
  ledger.add_piece(a, 0, 2500, crc_of(d, 0, 2500));
  ledger.add_piece(b, 0, 5000, crc_of(d, 5000, 10000));
  EXPECT_EQ(ledger.counts().records_checked, 1u);
  EXPECT_EQ(ledger.counts().records_partial, 1u);
  ledger.add_piece(a, 2500, 5000, crc_of(d, 2500, 5000));
  EXPECT_EQ(ledger.counts().records_checked, 2u);
  EXPECT_EQ(ledger.counts().records_partial, 0u);
}

TEST(ZipCrcLedger, EachBlobIsClaimedOnce) {
  ZipCrcLedger ledger;
  EXPECT_TRUE(ledger.claim_blob("__0_0.distcp", 0));
  EXPECT_FALSE(ledger.claim_blob("__0_0.distcp", 0));
  EXPECT_TRUE(ledger.claim_blob("__0_0.distcp", 4096));
  EXPECT_TRUE(ledger.claim_blob("__1_0.distcp", 0));
}

}  // namespace
}  // namespace shardpoint::engine
