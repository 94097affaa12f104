#include "torchfile/zip_reader.h"

#include <gtest/gtest.h>

#include "core/checksum.h"
#include "test_util.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_writer.h"

namespace shardpoint::torchfile {
namespace {

std::string small_archive(bool force64 = false) {
  StringSink sink;
  ZipWriter w(sink, {.force_zip64 = force64});
  w.write_record("archive/data.pkl", std::string(100, 'p'));
  w.write_record("archive/data/0", std::string(40, 'd'));
  w.write_record("archive/version", "3\n");
  w.finish();
  return sink.take();
}

std::string error_of(const std::string& bytes) {
  MemorySource src(as_bytes(bytes), "t.zip");
  try {
    ZipArchive a(src);
    for (const ZipEntry& e : a.entries()) {
      // Invariant: data ranges lie inside the source.
      ByteRange r = a.data_range(e);
      EXPECT_LE(r.offset + r.size, bytes.size());
      (void)a.read(e);
    }
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

void put32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put64(std::string& s, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST(ZipReader, ReadsPythonZipfileArchivesWithCommentDeflateAndNoPadding) {
  testing::TempDir dir;
  std::string path = dir.file("py.zip");
  auto r = testing::run_command("python3 -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1],'w'); "
                                "z.writestr(zipfile.ZipInfo('foo/data.pkl'), b'hello'); "
                                "z.writestr('foo/big', b'a'*1000, compress_type=zipfile.ZIP_DEFLATED); "
                                "z.comment=b'c'*300; z.close()\" " +
                                path + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string bytes = testing::read_text(path);
  MemorySource src(as_bytes(bytes), path);
  ZipArchive a(src);
  ASSERT_EQ(a.entries().size(), 2u);
  EXPECT_FALSE(a.has_zip64_end());
  const ZipEntry* pkl = a.find("foo/data.pkl");
  ASSERT_NE(pkl, nullptr);
  EXPECT_EQ(pkl->local_header_offset, 0u);
  EXPECT_EQ(pkl->data_offset, 30u + 12u);
  EXPECT_EQ(a.read(*pkl), "hello");
  EXPECT_EQ(pkl->crc32, crc32(0, as_bytes(std::string_view("hello"))));
  const ZipEntry* big = a.find("foo/big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->method, 8);
  EXPECT_EQ(big->uncompressed_size, 1000u);
  try {
    a.data_range(*big);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("\"foo/big\" is compressed (method 8)"), std::string::npos) << e.what();
  }
}

TEST(ZipReader, WindowOfALargerSource) {
  std::string blob = small_archive();
  std::string file = std::string(13, 'x') + blob + std::string(5, 'y');
  MemorySource whole(as_bytes(file), "__0_0.distcp");
  MemorySource window(as_bytes(file).subspan(13, blob.size()), "__0_0.distcp[13+" + std::to_string(blob.size()) + "]");
  ZipArchive a(window);
  EXPECT_EQ(a.read(*a.find("archive/data/0")), std::string(40, 'd'));
  EXPECT_EQ(a.find("archive/data/0")->data_offset % 64, 0u);
}

TEST(ZipReader, TruncationAtEveryLengthIsAFormatError) {
  for (bool force64 : {false, true}) {
    std::string z = small_archive(force64);
    ASSERT_EQ(error_of(z), "");
    for (std::size_t n = 0; n < z.size(); ++n) {
      EXPECT_NE(error_of(z.substr(0, n)), "") << "length " << n;
    }
  }
}

TEST(ZipReader, FlippedBytesNeverCrash) {
  for (bool force64 : {false, true}) {
    std::string z = small_archive(force64);
    int errors = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      for (unsigned char x : {0x01, 0x80, 0xff}) {
        std::string c = z;
        c[i] = static_cast<char>(c[i] ^ x);
        if (!error_of(c).empty()) ++errors;
      }
    }
    EXPECT_GT(errors, 100);
  }
}

TEST(ZipReader, ErrorMessagesNameRecordOffsetExpectedFound) {
  std::string z = small_archive();
  MemorySource ok(as_bytes(z), "t.zip");
  std::uint64_t lh = ZipArchive(ok).find("archive/data/0")->local_header_offset;
  std::string c = z;
  put32(c, lh, 0);
  EXPECT_EQ(error_of(c), "t.zip: zip local header of \"archive/data/0\" at offset " + std::to_string(lh) +
                             ": expected PK\\3\\4, found 00 00 00 00");
  EXPECT_NE(error_of("hello").find("not a zip archive"), std::string::npos);
  EXPECT_NE(error_of(std::string(100, '\0')).find("no end of central directory record"), std::string::npos);
}

TEST(ZipReader, LyingCountsSizesAndOffsets) {
  std::string z = small_archive();
  const std::size_t eocd = z.size() - zip::kEocdSize;
  const std::size_t loc = eocd - zip::kEocd64LocatorSize;
  const std::size_t e64 = loc - zip::kEocd64Size;
  MemorySource ok(as_bytes(z), "t.zip");
  ZipArchive a(ok);
  const std::uint64_t cd = a.entries().back().data_offset + 2 + 16;  // after version + descriptor
  {                                                                  // count far too large (zip64 record wins)
    std::string c = z;
    put64(c, e64 + 32, 1ull << 40);
    EXPECT_NE(error_of(c).find("entries cannot fit"), std::string::npos) << error_of(c);
  }
  {  // cd size past the end
    std::string c = z;
    put64(c, e64 + 40, 1ull << 62);
    EXPECT_NE(error_of(c).find("does not end before the end records"), std::string::npos) << error_of(c);
  }
  {  // cd offset wraps
    std::string c = z;
    put64(c, e64 + 48, ~0ull - 5);
    EXPECT_NE(error_of(c), "");
  }
  {  // zip64 locator points past itself
    std::string c = z;
    put64(c, loc + 8, ~0ull);
    EXPECT_NE(error_of(c).find("zip64 locator"), std::string::npos) << error_of(c);
  }
  {  // an entry's size runs into the central directory
    std::string c = z;
    put32(c, cd + 20, 1000000);
    put32(c, cd + 24, 1000000);
    EXPECT_NE(error_of(c).find("does not end before the central directory"), std::string::npos) << error_of(c);
  }
  {  // stored with differing sizes
    std::string c = z;
    put32(c, cd + 20, 5);
    EXPECT_NE(error_of(c).find("stored record with compressed size 5"), std::string::npos) << error_of(c);
  }
  {  // local header offset into the central directory
    std::string c = z;
    put32(c, cd + 42, static_cast<std::uint32_t>(cd));
    EXPECT_NE(error_of(c), "");
  }
  {  // name length larger than the directory
    std::string c = z;
    c[cd + 28] = '\xff';
    c[cd + 29] = '\xff';
    EXPECT_NE(error_of(c), "");
  }
  {  // zip64 markers in the central entry without the extra field
    std::string c = z;
    put32(c, cd + 42, zip::kU32Max);
    EXPECT_NE(error_of(c), "");
  }
}

TEST(ZipReader, ClassicEocdOnly) {
  // Strip the zip64 records: patch nothing else (classic EOCD holds real values).
  std::string z = small_archive();
  const std::size_t eocd = z.size() - zip::kEocdSize;
  const std::size_t e64 = eocd - zip::kEocd64LocatorSize - zip::kEocd64Size;
  std::string c = z.substr(0, e64) + z.substr(eocd);
  MemorySource src(as_bytes(c), "classic.zip");
  ZipArchive a(src);
  EXPECT_FALSE(a.has_zip64_end());
  EXPECT_EQ(a.entries().size(), 3u);
  EXPECT_EQ(a.read(*a.find("archive/version")), "3\n");
}

}  // namespace
}  // namespace shardpoint::torchfile
