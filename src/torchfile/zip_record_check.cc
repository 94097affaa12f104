#include "torchfile/zip_record_check.h"

#include <algorithm>
#include <cstdio>

#include "core/byte_io.h"
#include "core/checksum.h"
#include "torchfile/zip_format.h"

namespace shardpoint::torchfile {
namespace {

std::string u32_text(std::uint32_t v) { return std::to_string(v); }

// The local header's CRC and 32-bit sizes against the central entry's.
void check_local_header(const ZipArchive& archive, const ZipEntry& entry, RecordCheck& out) {
  const std::string what = "zip local header of \"" + entry.name + "\"";
  char hdr[zip::kLocalHeaderSize];
  archive.source().read(entry.local_header_offset, std::as_writable_bytes(std::span(hdr)), what);
  const std::byte* p = std::as_bytes(std::span(hdr)).data();
  const std::uint64_t at = entry.local_header_offset;
  auto problem = [&](const std::string& field, const std::string& expected, const std::string& found) {
    out.header_problems.push_back(what + " at offset " + std::to_string(at) + ": expected " + field + " " + expected +
                                  " (central directory), found " + found);
  };
  const std::uint16_t flags = get_le<std::uint16_t>(p + 6);
  const std::uint16_t method = get_le<std::uint16_t>(p + 8);
  const std::uint32_t crc = get_le<std::uint32_t>(p + 14);
  const std::uint32_t comp = get_le<std::uint32_t>(p + 18);
  const std::uint32_t uncomp = get_le<std::uint32_t>(p + 22);
  if (flags != entry.flags) problem("flags", std::to_string(entry.flags), std::to_string(flags));
  if (method != entry.method) problem("method", std::to_string(entry.method), std::to_string(method));
  const bool deferred = (entry.flags & zip::kFlagDataDescriptor) != 0;
  if (crc != entry.crc32 && !(deferred && crc == 0)) {
    problem("CRC-32", crc32_hex(entry.crc32) + (deferred ? " or 0" : ""), crc32_hex(crc));
  }
  auto size_ok = [&](std::uint32_t v, std::uint64_t want) {
    return v == want || v == zip::kU32Max || (deferred && v == 0);
  };
  if (!size_ok(comp, entry.compressed_size)) {
    problem("compressed size", std::to_string(entry.compressed_size) + (deferred ? " or 0" : ""), u32_text(comp));
  }
  if (!size_ok(uncomp, entry.uncompressed_size)) {
    problem("size", std::to_string(entry.uncompressed_size) + (deferred ? " or 0" : ""), u32_text(uncomp));
  }
}

// The data descriptor after the data (flag 0x0008): [PK\7\8] crc, then sizes as two u32 or
// (zip64) two u64. The signature is optional in the format; PyTorch writes it.
void check_data_descriptor(const ZipArchive& archive, const ZipEntry& entry, RecordCheck& out) {
  const std::uint64_t at = entry.data_offset + entry.compressed_size;
  const std::uint64_t size = archive.source().size();
  const std::string what = "zip data descriptor of \"" + entry.name + "\"";
  const std::uint64_t n = at < size ? std::min<std::uint64_t>(24, size - at) : 0;
  char buf[24] = {};
  if (n < 12) {
    out.header_problems.push_back(what + " at offset " + std::to_string(at) + ": expected at least 12 bytes, found " +
                                  std::to_string(n));
    return;
  }
  archive.source().read(at, std::as_writable_bytes(std::span(buf, static_cast<std::size_t>(n))), what);
  const std::byte* p = std::as_bytes(std::span(buf)).data();
  std::uint64_t pos = get_le<std::uint32_t>(p) == zip::kDataDescriptorSig ? 4 : 0;
  if (n < pos + 12) {
    out.header_problems.push_back(what + " at offset " + std::to_string(at) + ": expected at least " +
                                  std::to_string(pos + 12) + " bytes, found " + std::to_string(n));
    return;
  }
  const std::uint32_t crc = get_le<std::uint32_t>(p + pos);
  if (crc != entry.crc32) {
    out.header_problems.push_back(what + " at offset " + std::to_string(at) + ": expected CRC-32 " +
                                  crc32_hex(entry.crc32) + " (central directory), found " + crc32_hex(crc));
  }
  const bool sizes32 = get_le<std::uint32_t>(p + pos + 4) == entry.compressed_size &&
                       get_le<std::uint32_t>(p + pos + 8) == entry.uncompressed_size;
  const bool sizes64 = n >= pos + 20 && get_le<std::uint64_t>(p + pos + 4) == entry.compressed_size &&
                       get_le<std::uint64_t>(p + pos + 12) == entry.uncompressed_size;
  if (!sizes32 && !sizes64) {
    out.header_problems.push_back(what + " at offset " + std::to_string(at) + ": expected sizes " +
                                  std::to_string(entry.compressed_size) + " (central directory), found " +
                                  u32_text(get_le<std::uint32_t>(p + pos + 4)) + "/" +
                                  u32_text(get_le<std::uint32_t>(p + pos + 8)));
  }
}

}  // namespace

std::string crc32_hex(std::uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

RecordCheck check_zip_record(const ZipArchive& archive, const ZipEntry& entry, bool check_crc,
                             std::span<std::byte> scratch) {
  RecordCheck out;
  out.expected = entry.crc32;
  out.data = {entry.data_offset, entry.compressed_size};
  check_local_header(archive, entry, out);
  if ((entry.flags & zip::kFlagDataDescriptor) != 0) check_data_descriptor(archive, entry, out);
  if (!check_crc || entry.method != zip::kMethodStored) return out;

  std::uint32_t crc = 0;
  for (std::uint64_t done = 0; done < entry.uncompressed_size;) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(scratch.size(), entry.uncompressed_size - done));
    archive.source().read(entry.data_offset + done, scratch.first(n), "zip record \"" + entry.name + "\"");
    crc = crc32(crc, scratch.first(n));
    done += n;
  }
  out.found = crc;
  if (crc == entry.crc32) {
    out.crc = RecordCrc::kMatch;
  } else if (entry.crc32 == 0) {
    out.crc = RecordCrc::kNotRecorded;
  } else {
    out.crc = RecordCrc::kMismatch;
  }
  return out;
}

}  // namespace shardpoint::torchfile
