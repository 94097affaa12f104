#include "torchfile/zip_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "core/byte_io.h"
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
  // Offsets of docs/dcp-format.md §5.6 (1.13 output for arange(6) float32).
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
  EXPECT_EQ(get_le<std::uint32_t>(b + 14), 0u);            // crc in descriptor
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

void check_round_trip(const std::string& z, std::uint64_t base,
                      const std::vector<std::pair<std::string, std::string>>& recs, std::uint32_t alignment) {
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

// Records writes of small pieces; large pieces (the zero data of huge records) become
// holes that read back as zeros. Lets a > 4 GiB archive be written and read cheaply.
class SparseSink final : public ByteSink {
 public:
  void write(ByteSpan data) override {
    if (data.size() < (1u << 20)) segments_[pos_] = std::string(as_chars(data));
    pos_ += data.size();
  }
  using ByteSink::write;
  std::uint64_t position() const override { return pos_; }
  const std::map<std::uint64_t, std::string>& segments() const { return segments_; }

 private:
  std::uint64_t pos_ = 0;
  std::map<std::uint64_t, std::string> segments_;
};

class SparseSource final : public ByteSource {
 public:
  explicit SparseSource(const SparseSink& sink) : sink_(sink), name_("sparse.zip") {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return sink_.position(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    std::fill(out.begin(), out.end(), std::byte{0});
    for (const auto& [at, bytes] : sink_.segments()) {
      std::uint64_t lo = std::max(at, offset), hi = std::min(at + bytes.size(), offset + out.size());
      if (lo < hi) std::memcpy(out.data() + (lo - offset), bytes.data() + (lo - at), hi - lo);
    }
  }

 private:
  const SparseSink& sink_;
  std::string name_;
};

// Real zip64: records of more than 4 GiB (declared and undeclared size) and a record whose
// header starts past 4 GiB, read back by ZipArchive and by Python's zipfile.
TEST(ZipWriter, RealZip64BeyondFourGiB) {
  const std::string zeros(1u << 20, '\0');
  const std::uint64_t big = (std::uint64_t{4} << 30) + 5;
  SparseSink sink;
  ZipWriter w(sink);
  w.write_record("a/small", "hello");
  std::uint32_t crc = 0;
  for (const char* name : {"a/big_unknown", "a/big_known"}) {
    w.begin_record(name, std::string_view(name) == "a/big_known" ? std::optional<std::uint64_t>(big) : std::nullopt);
    crc = 0;
    for (int i = 0; i < 4096; ++i) {
      w.write(zeros);
      crc = crc32(crc, as_bytes(zeros));
    }
    w.write(std::string_view("\0\0\0\0\0", 5));
    crc = crc32(crc, as_bytes(std::string_view("\0\0\0\0\0", 5)));
    w.end_record();
  }
  w.write_record("a/after", "xyz");
  w.finish();
  ASSERT_EQ(w.records().size(), 4u);
  EXPECT_FALSE(w.records()[0].zip64_local);
  EXPECT_FALSE(w.records()[1].zip64_local);  // size unknown, header offset < 4 GiB
  EXPECT_TRUE(w.records()[2].zip64_local);   // size declared >= 4 GiB (and offset)
  EXPECT_TRUE(w.records()[3].zip64_local);   // header offset >= 4 GiB
  SparseSource src(sink);
  ZipArchive a(src);
  ASSERT_EQ(a.entries().size(), 4u);
  for (int i : {1, 2}) {
    const ZipEntry& e = a.entries()[i];
    EXPECT_EQ(e.uncompressed_size, big);
    EXPECT_EQ(e.compressed_size, big);
    EXPECT_EQ(e.crc32, crc);
    EXPECT_EQ(e.data_offset % 64, 0u);
    EXPECT_EQ(e.local_header_offset, w.records()[i].local_header_offset);
  }
  const ZipEntry& after = *a.find("a/after");
  EXPECT_GT(after.local_header_offset, std::uint64_t{8} << 30);
  EXPECT_EQ(after.data_offset % 64, 0u);
  EXPECT_EQ(a.read(after), "xyz");
  EXPECT_EQ(a.read(*a.find("a/small")), "hello");
  // Python's zipfile reads the same directory from a sparse file.
  testing::TempDir dir;
  std::string path = dir.file("big.zip");
  {
    UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC);
    for (const auto& [at, bytes] : sink.segments()) fd.pwrite_all(as_bytes(bytes), at);
    ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(sink.position())), 0);
  }
  auto r =
      testing::run_command("python3 -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); "
                           "print(','.join('%s:%d:%08x' % (i.filename, i.file_size, i.CRC) for i in z.infolist())); "
                           "print(z.read('a/after').decode())\" " +
                           path + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  char want[256];
  std::snprintf(want, sizeof want, "a/small:5:%08x,a/big_unknown:%llu:%08x,a/big_known:%llu:%08x,a/after:3:%08x\nxyz\n",
                crc32(0, as_bytes(std::string_view("hello"))), static_cast<unsigned long long>(big), crc,
                static_cast<unsigned long long>(big), crc, crc32(0, as_bytes(std::string_view("xyz"))));
  EXPECT_EQ(r.output, want);
}

}  // namespace
}  // namespace shardpoint::torchfile
