#include "torchfile/zip_writer.h"

#include <gtest/gtest.h>

#include "core/checksum.h"
#include "test_util.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::torchfile {
namespace {

std::string pattern(std::size_t n, int seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed * 7) & 0xff);
  return s;
}

TEST(ZipWriter, LayoutMatchesTorchSave) {
  StringSink sink;
  ZipWriter w(sink);
  w.write_record("archive/data.pkl", std::string(154, 'p'));
  w.write_record("archive/data/0", std::string(24, 'd'));
  w.write_record("archive/version", "3\n");
  w.finish();
  const std::string& z = sink.str();
  // Offsets of spec/dcp-format.md §5.6 (1.13 output for arange(6) float32).
  ASSERT_EQ(w.records().size(), 3u);
  EXPECT_EQ(w.records()[0].local_header_offset, 0u);
  EXPECT_EQ(w.records()[0].data_offset, 64u);
  EXPECT_EQ(w.records()[1].local_header_offset, 234u);
  EXPECT_EQ(w.records()[1].data_offset, 320u);
  EXPECT_EQ(w.records()[2].local_header_offset, 360u);
  EXPECT_EQ(w.records()[2].data_offset, 448u);
  EXPECT_EQ(z.size(), 747u);
  const auto* b = reinterpret_cast<const std::byte*>(z.data());
  EXPECT_EQ(get_le<std::uint32_t>(b), zip::kLocalHeaderSig);
  EXPECT_EQ(get_le<std::uint16_t>(b + 6), 0x0808);
  EXPECT_EQ(get_le<std::uint32_t>(b + 14), 0u);  // crc in descriptor
  EXPECT_EQ(get_le<std::uint16_t>(b + 28), 64 - 30 - 16);  // FB field: 4 + 14 pad
  EXPECT_EQ(get_le<std::uint16_t>(b + 30 + 16), zip::kPaddingExtraId);
  EXPECT_EQ(get_le<std::uint16_t>(b + 30 + 16 + 2), 14);
  EXPECT_EQ(z.substr(50, 14), std::string(14, 'Z'));
  // data descriptor after data.pkl
  EXPECT_EQ(get_le<std::uint32_t>(b + 64 + 154), zip::kDataDescriptorSig);
  EXPECT_EQ(get_le<std::uint32_t>(b + 64 + 154 + 4), crc32(0, as_bytes(std::string(154, 'p'))));
  EXPECT_EQ(get_le<std::uint32_t>(b + 64 + 154 + 8), 154u);
  // end records: cd @466, zip64 eocd @649, locator @705, eocd @725
  EXPECT_EQ(get_le<std::uint32_t>(b + 466), zip::kCentralHeaderSig);
  EXPECT_EQ(get_le<std::uint32_t>(b + 649), zip::kEocd64Sig);
  EXPECT_EQ(get_le<std::uint32_t>(b + 705), zip::kEocd64LocatorSig);
  EXPECT_EQ(get_le<std::uint64_t>(b + 705 + 8), 649u);
  EXPECT_EQ(get_le<std::uint32_t>(b + 725), zip::kEocdSig);
  EXPECT_EQ(get_le<std::uint16_t>(b + 725 + 10), 3);
  EXPECT_EQ(get_le<std::uint32_t>(b + 725 + 12), 649u - 466u);
  EXPECT_EQ(get_le<std::uint32_t>(b + 725 + 16), 466u);
}

void check_round_trip(const std::string& z, std::uint64_t base, const std::vector<std::pair<std::string, std::string>>& recs,
                      std::uint32_t alignment) {
  MemorySource src(as_bytes(z).subspan(base), "test.zip");
  ZipArchive a(src);
  ASSERT_EQ(a.entries().size(), recs.size());
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const ZipEntry& e = a.entries()[i];
    EXPECT_EQ(e.name, recs[i].first);
    EXPECT_EQ(e.uncompressed_size, recs[i].second.size());
    EXPECT_EQ(e.crc32, crc32(0, as_bytes(recs[i].second)));
    EXPECT_EQ(e.data_offset % alignment, 0u) << e.name;
    EXPECT_EQ(a.read(e), recs[i].second);
    auto v = a.view(e);
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(as_chars(*v), recs[i].second);
    EXPECT_EQ(a.find(e.name), &e);
  }
  EXPECT_TRUE(a.has_zip64_end());
  EXPECT_EQ(a.find("nope"), nullptr);
}

TEST(ZipWriter, RoundTripManySizesStreamedAndAppended) {
  for (bool force64 : {false, true}) {
    for (std::uint32_t alignment : {64u, 1u, 4096u}) {
      StringSink sink;
      sink.write(std::string_view("previous blob bytes"));  // archive appended to a .distcp-like sink
      std::uint64_t base = sink.position();
      ZipWriter w(sink, {.alignment = alignment, .force_zip64 = force64});
      std::vector<std::pair<std::string, std::string>> recs;
      for (int i = 0; i < 40; ++i) {
        std::string name = "archive/data/" + std::to_string(i) + std::string(i % 7, 'x');
        std::string data = pattern(static_cast<std::size_t>(i * i * 13 + (i % 3)), i);
        if (i % 2 == 0) {
          w.write_record(name, data);
        } else {
          w.begin_record(name, i % 4 == 1 ? std::optional<std::uint64_t>(data.size()) : std::nullopt);
          for (std::size_t off = 0; off < data.size(); off += 17) w.write(std::string_view(data).substr(off, 17));
          w.end_record();
        }
        recs.emplace_back(name, data);
      }
      w.finish();
      EXPECT_EQ(w.archive_size(), sink.position() - base);
      SCOPED_TRACE(::testing::Message() << "force64=" << force64 << " alignment=" << alignment);
      check_round_trip(sink.str(), base, recs, alignment);
    }
  }
}

TEST(ZipWriter, EmptyArchiveAndEmptyRecord) {
  StringSink sink;
  ZipWriter w(sink);
  w.finish();
  MemorySource src(as_bytes(sink.str()), "empty.zip");
  ZipArchive a(src);
  EXPECT_TRUE(a.entries().empty());
  StringSink sink2;
  ZipWriter w2(sink2);
  w2.write_record("a/empty", "");
  w2.finish();
  check_round_trip(sink2.str(), 0, {{"a/empty", ""}}, 64);
}

TEST(ZipWriter, UsageErrors) {
  StringSink sink;
  ZipWriter w(sink);
  EXPECT_THROW(w.write(std::string_view("x")), UsageError);
  EXPECT_THROW(w.end_record(), UsageError);
  w.begin_record("a", 3);
  EXPECT_THROW(w.begin_record("b"), UsageError);
  EXPECT_THROW(w.write(std::string_view("abcd")), UsageError);
  w.write(std::string_view("ab"));
  EXPECT_THROW(w.end_record(), UsageError);
  EXPECT_THROW(w.finish(), UsageError);
  w.write(std::string_view("c"));
  w.end_record();
  EXPECT_THROW(w.write_record("a", "dup"), UsageError);
  w.finish();
  EXPECT_THROW(w.finish(), UsageError);
  EXPECT_THROW(w.begin_record("c"), UsageError);
  EXPECT_THROW(ZipWriter(sink, {.alignment = 0}), UsageError);
}

// Python's zipfile (not our code) reads what we write, zip64 included.
TEST(ZipWriter, PythonZipfileReadsIt) {
  testing::TempDir dir;
  for (bool force64 : {false, true}) {
    StringSink sink;
    ZipWriter w(sink, {.force_zip64 = force64});
    w.write_record("archive/data.pkl", pattern(1000, 1));
    w.write_record("archive/data/0", pattern(77, 2));
    w.finish();
    std::string path = dir.file(force64 ? "z64.zip" : "z.zip");
    testing::write_text(path, sink.str());
    auto r = testing::run_command(
        "python3 -c \"import zipfile,sys,zlib; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; "
        "print(','.join('%s:%d:%08x' % (i.filename, i.file_size, zlib.crc32(z.read(i))) for i in z.infolist()))\" " +
        path + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    char want[200];
    std::snprintf(want, sizeof want, "archive/data.pkl:1000:%08x,archive/data/0:77:%08x\n",
                  crc32(0, as_bytes(pattern(1000, 1))), crc32(0, as_bytes(pattern(77, 2))));
    EXPECT_EQ(r.output, want);
  }
}

}  // namespace
}  // namespace shardpoint::torchfile
