#include "torchfile/zip_reader.h"

#include <algorithm>
#include <cstdio>

#include "shardpoint/error.h"
#include "torchfile/zip_format.h"

namespace shardpoint::torchfile {
namespace {

std::string sig_text(std::uint32_t sig) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "PK\\%u\\%u", (sig >> 16) & 0xff, (sig >> 24) & 0xff);
  return buf;
}

}  // namespace

std::string hex_bytes(ByteSpan bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 4; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", std::to_integer<unsigned>(bytes[i]));
    if (!out.empty()) out.push_back(' ');
    out += buf;
  }
  return out.empty() ? "nothing" : out;
}

ZipArchive::ZipArchive(const ByteSource& source) : source_(&source) { parse(); }

void ZipArchive::parse() {
  const ByteSource& src = *source_;
  const std::string& sname = src.name();
  auto fail = [&](const std::string& what, std::uint64_t offset, const std::string& detail) -> void {
    throw FormatError(sname + ": " + what + " at offset " + std::to_string(offset) + ": " + detail);
  };
  auto expect_sig = [&](ByteSpan at, std::uint32_t sig, const std::string& what, std::uint64_t offset) {
    if (at.size() < 4 || get_le<std::uint32_t>(at.data()) != sig) {
      fail(what, offset, "expected " + sig_text(sig) + ", found " + hex_bytes(at));
    }
  };

  const std::uint64_t size = src.size();
  if (size < zip::kEocdSize) {
    throw FormatError(sname + ": not a zip archive: " + std::to_string(size) +
                      " bytes, an end of central directory record needs " + std::to_string(zip::kEocdSize));
  }

  // 1. Find the classic end of central directory record, scanning back over a comment.
  // Archives without a comment (torch.save's) have it in the last 22 bytes: read a small
  // tail first, and the largest possible comment's worth only when that fails, so opening
  // a blob inside a .distcp file costs a few hundred bytes of reads, not 64 KiB.
  std::string tail;
  std::uint64_t tail_len = 0, tail_start = 0;
  std::optional<std::uint64_t> eocd_rel;
  for (std::uint64_t want : {std::uint64_t{512}, std::uint64_t{zip::kEocdSize + zip::kMaxCommentSize}}) {
    tail_len = std::min<std::uint64_t>(size, want);
    tail_start = size - tail_len;
    tail = src.read_string(tail_start, tail_len, "zip end records");
    ByteSpan tb = as_bytes(tail);
    for (std::uint64_t i = tail_len - zip::kEocdSize + 1; i-- > 0;) {
      const std::byte* p = tb.data() + i;
      if (get_le<std::uint32_t>(p) != zip::kEocdSig) continue;
      std::uint16_t comment_len = get_le<std::uint16_t>(p + 20);
      if (i + zip::kEocdSize + comment_len <= tail_len) {
        eocd_rel = i;
        break;
      }
    }
    if (eocd_rel || tail_len == size) break;
  }
  ByteSpan tail_bytes = as_bytes(tail);
  if (!eocd_rel) {
    throw FormatError(sname + ": not a zip archive: no end of central directory record (PK\\5\\6) in the last " +
                      std::to_string(tail_len) + " bytes (last bytes: " + hex_bytes(tail_bytes.subspan(tail_len - 4)) +
                      ")");
  }
  const std::uint64_t eocd_pos = tail_start + *eocd_rel;
  ByteCursor eocd(tail_bytes.subspan(*eocd_rel + 4, zip::kEocdSize - 4), eocd_pos + 4);
  std::uint16_t disk = eocd.read_le<std::uint16_t>("EOCD disk");
  std::uint16_t cd_disk = eocd.read_le<std::uint16_t>("EOCD cd disk");
  eocd.read_le<std::uint16_t>("EOCD entries on disk");
  std::uint64_t count = eocd.read_le<std::uint16_t>("EOCD entries");
  std::uint64_t cd_size = eocd.read_le<std::uint32_t>("EOCD cd size");
  std::uint64_t cd_offset = eocd.read_le<std::uint32_t>("EOCD cd offset");
  std::uint64_t cd_limit = eocd_pos;  // the central directory ends before the end records

  // 2. ZIP64 locator right before the EOCD, pointing at the ZIP64 EOCD.
  if (eocd_pos >= zip::kEocd64LocatorSize) {
    const std::uint64_t loc_pos = eocd_pos - zip::kEocd64LocatorSize;
    std::string loc = src.read_string(loc_pos, zip::kEocd64LocatorSize, "zip64 locator");
    ByteSpan lb = as_bytes(loc);
    if (get_le<std::uint32_t>(lb.data()) == zip::kEocd64LocatorSig) {
      zip64_ = true;
      std::uint64_t e64_pos = get_le<std::uint64_t>(lb.data() + 8);
      std::uint32_t disks = get_le<std::uint32_t>(lb.data() + 16);
      if (disks > 1) fail("zip64 locator", loc_pos, "expected 1 disk, found " + std::to_string(disks));
      if (e64_pos > loc_pos || loc_pos - e64_pos < zip::kEocd64Size) {
        fail("zip64 locator", loc_pos,
             "zip64 end of central directory offset " + std::to_string(e64_pos) +
                 " leaves no room for its 56 bytes before the locator at " + std::to_string(loc_pos));
      }
      std::string e64 = src.read_string(e64_pos, zip::kEocd64Size, "zip64 end of central directory");
      ByteSpan eb = as_bytes(e64);
      expect_sig(eb, zip::kEocd64Sig, "zip64 end of central directory", e64_pos);
      std::uint64_t rec_size = get_le<std::uint64_t>(eb.data() + 4);
      if (rec_size < zip::kEocd64Size - 12 || rec_size > loc_pos - e64_pos - 12) {
        fail("zip64 end of central directory", e64_pos,
             "record size " + std::to_string(rec_size) + " does not fit before the locator");
      }
      disk = get_le<std::uint32_t>(eb.data() + 16) != 0 ? 1 : 0;
      cd_disk = get_le<std::uint32_t>(eb.data() + 20) != 0 ? 1 : 0;
      count = get_le<std::uint64_t>(eb.data() + 32);
      cd_size = get_le<std::uint64_t>(eb.data() + 40);
      cd_offset = get_le<std::uint64_t>(eb.data() + 48);
      cd_limit = e64_pos;
    }
  }
  if (disk != 0 || cd_disk != 0) {
    fail("end of central directory", eocd_pos, "multi-disk archives are not supported");
  }

  // 3. The central directory: bounds, then a count bounded by its size.
  if (cd_offset > cd_limit || cd_size > cd_limit - cd_offset) {
    fail("end of central directory", eocd_pos,
         "central directory [" + std::to_string(cd_offset) + ", +" + std::to_string(cd_size) +
             ") does not end before the end records at " + std::to_string(cd_limit));
  }
  if (count > cd_size / zip::kCentralHeaderSize) {
    fail("end of central directory", eocd_pos,
         std::to_string(count) + " entries cannot fit in a central directory of " + std::to_string(cd_size) +
             " bytes (46 bytes each at least)");
  }
  // Parse the directory in place when the source is mapped; copy it otherwise.
  std::string cd_copy;
  std::optional<ByteSpan> cd = src.view(cd_offset, cd_size, "zip central directory");
  if (!cd) {
    cd_copy = src.read_string(cd_offset, cd_size, "zip central directory");
    cd = as_bytes(cd_copy);
  }
  ByteCursor cur(*cd, cd_offset);
  entries_.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t at = cur.file_offset();
    const std::string what = "zip central directory entry " + std::to_string(i);
    cur.require(zip::kCentralHeaderSize, what);
    ByteSpan sig = cur.read_bytes(4, what);
    expect_sig(sig, zip::kCentralHeaderSig, what, at);
    ZipEntry e;
    cur.read_le<std::uint16_t>(what);  // made by
    cur.read_le<std::uint16_t>(what);  // needed
    e.flags = cur.read_le<std::uint16_t>(what);
    e.method = cur.read_le<std::uint16_t>(what);
    cur.read_le<std::uint32_t>(what);  // time, date
    e.crc32 = cur.read_le<std::uint32_t>(what);
    std::uint32_t comp32 = cur.read_le<std::uint32_t>(what);
    std::uint32_t uncomp32 = cur.read_le<std::uint32_t>(what);
    std::uint16_t name_len = cur.read_le<std::uint16_t>(what);
    std::uint16_t extra_len = cur.read_le<std::uint16_t>(what);
    std::uint16_t comment_len = cur.read_le<std::uint16_t>(what);
    std::uint16_t disk_start = cur.read_le<std::uint16_t>(what);
    cur.read_le<std::uint16_t>(what);  // internal attributes
    cur.read_le<std::uint32_t>(what);  // external attributes
    std::uint32_t off32 = cur.read_le<std::uint32_t>(what);
    e.name = std::string(as_chars(cur.read_bytes(name_len, what + " name")));
    const std::string ewhat = "zip central directory entry \"" + e.name + "\"";
    ByteCursor extra(cur.read_bytes(extra_len, ewhat + " extra field"), cur.file_offset() - extra_len);
    cur.skip(comment_len, ewhat + " comment");
    e.compressed_size = comp32;
    e.uncompressed_size = uncomp32;
    e.local_header_offset = off32;
    while (!extra.at_end()) {
      std::uint16_t id = extra.read_le<std::uint16_t>(ewhat + " extra field id");
      std::uint16_t len = extra.read_le<std::uint16_t>(ewhat + " extra field length");
      ByteCursor field(extra.read_bytes(len, ewhat + " extra field"), extra.file_offset() - len);
      if (id != zip::kZip64ExtraId) continue;
      if (uncomp32 == zip::kU32Max) e.uncompressed_size = field.read_le<std::uint64_t>(ewhat + " zip64 size");
      if (comp32 == zip::kU32Max) e.compressed_size = field.read_le<std::uint64_t>(ewhat + " zip64 compressed size");
      if (off32 == zip::kU32Max) e.local_header_offset = field.read_le<std::uint64_t>(ewhat + " zip64 offset");
      if (disk_start == zip::kU16Max) field.read_le<std::uint32_t>(ewhat + " zip64 disk");
    }
    if (e.method == zip::kMethodStored && e.compressed_size != e.uncompressed_size) {
      fail(ewhat, at,
           "stored record with compressed size " + std::to_string(e.compressed_size) + " != uncompressed size " +
               std::to_string(e.uncompressed_size));
    }

    // 4. The local header: it alone says where the data starts.
    const std::uint64_t lh = e.local_header_offset;
    const std::string lwhat = "zip local header of \"" + e.name + "\"";
    if (lh > cd_offset || cd_offset - lh < zip::kLocalHeaderSize + name_len) {
      fail(ewhat, at,
           "local header offset " + std::to_string(lh) + " + " + std::to_string(zip::kLocalHeaderSize + name_len) +
               " bytes of header and name does not end before the central directory at " + std::to_string(cd_offset));
    }
    char hdr[zip::kLocalHeaderSize];
    src.read(lh, std::as_writable_bytes(std::span(hdr)), lwhat);
    ByteSpan hb = std::as_bytes(std::span(hdr));
    expect_sig(hb, zip::kLocalHeaderSig, lwhat, lh);
    std::uint16_t lname_len = get_le<std::uint16_t>(hb.data() + 26);
    std::uint16_t lextra_len = get_le<std::uint16_t>(hb.data() + 28);
    if (lname_len != name_len) {
      fail(lwhat, lh,
           "expected name length " + std::to_string(name_len) + " (central directory), found " +
               std::to_string(lname_len));
    }
    std::string lname = src.read_string(lh + zip::kLocalHeaderSize, lname_len, lwhat + " name");
    if (lname != e.name) fail(lwhat, lh, "expected name \"" + e.name + "\", found \"" + lname + "\"");
    e.data_offset = lh + zip::kLocalHeaderSize + lname_len + lextra_len;
    if (e.data_offset > cd_offset || e.compressed_size > cd_offset - e.data_offset) {
      fail(lwhat, lh,
           "data [" + std::to_string(e.data_offset) + ", +" + std::to_string(e.compressed_size) +
               ") does not end before the central directory at " + std::to_string(cd_offset));
    }
    by_name_.emplace(e.name, entries_.size());
    entries_.push_back(std::move(e));
  }
}

const ZipEntry* ZipArchive::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

ByteRange ZipArchive::data_range(const ZipEntry& entry) const {
  if (entry.method != zip::kMethodStored) {
    throw FormatError(source_->name() + ": zip record \"" + entry.name + "\" is compressed (method " +
                      std::to_string(entry.method) +
                      "); only stored (uncompressed) records are supported, as torch.save writes them");
  }
  return {entry.data_offset, entry.uncompressed_size};
}

std::optional<ByteSpan> ZipArchive::view(const ZipEntry& entry) const {
  ByteRange r = data_range(entry);
  return source_->view(r.offset, r.size, "zip record \"" + entry.name + "\"");
}

std::string ZipArchive::read(const ZipEntry& entry) const {
  ByteRange r = data_range(entry);
  return source_->read_string(r.offset, r.size, "zip record \"" + entry.name + "\"");
}

}  // namespace shardpoint::torchfile
