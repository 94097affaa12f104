#include "torchfile/zip_writer.h"

#include "core/checksum.h"
#include "shardpoint/error.h"
#include "torchfile/zip_format.h"

namespace shardpoint::torchfile {
namespace {

bool needs_zip64(std::uint64_t v) { return v >= zip::kU32Max; }

}  // namespace

ZipWriter::ZipWriter(ByteSink& sink, ZipWriterOptions options)
    : sink_(sink), options_(options), base_(sink.position()) {
  if (options_.alignment < 1 || options_.alignment > 32768) {
    throw UsageError("ZipWriter: alignment " + std::to_string(options_.alignment) + " is not in [1, 32768]");
  }
}

void ZipWriter::begin_record(const std::string& name, std::optional<std::uint64_t> size) {
  if (finished_) throw UsageError("ZipWriter: begin_record(\"" + name + "\") after finish()");
  if (open_) throw UsageError("ZipWriter: begin_record(\"" + name + "\") while \"" + open_->info.name + "\" is open");
  if (name.size() > zip::kU16Max) throw UsageError("ZipWriter: record name longer than 65535 bytes");
  if (!names_.insert(name).second) throw UsageError("ZipWriter: duplicate record \"" + name + "\"");

  const std::uint64_t offset = archive_size();
  const bool big = size && needs_zip64(*size);
  const bool far = needs_zip64(offset);
  const bool sizes64 = big || options_.force_zip64;
  const bool offset64 = far || options_.force_zip64;
  std::string header;
  header.reserve(zip::kLocalHeaderSize + name.size() + 32);
  put_le<std::uint32_t>(header, zip::kLocalHeaderSig);
  put_le<std::uint16_t>(header, 0);  // version needed (as PyTorch)
  put_le<std::uint16_t>(header, zip::kFlagDataDescriptor | zip::kFlagUtf8);
  put_le<std::uint16_t>(header, zip::kMethodStored);
  put_le<std::uint32_t>(header, 0);  // time, date
  put_le<std::uint32_t>(header, 0);  // crc: in the descriptor
  put_le<std::uint32_t>(header, 0);  // sizes: in the descriptor
  put_le<std::uint32_t>(header, 0);
  std::uint16_t zip64_len =
      (sizes64 || offset64) ? static_cast<std::uint16_t>(4 + (sizes64 ? 16 : 0) + (offset64 ? 8 : 0)) : 0;
  std::uint64_t start = offset + zip::kLocalHeaderSize + name.size() + zip64_len + 4;
  std::uint64_t pad = (options_.alignment - start % options_.alignment) % options_.alignment;
  put_le<std::uint16_t>(header, static_cast<std::uint16_t>(name.size()));
  put_le<std::uint16_t>(header, static_cast<std::uint16_t>(zip64_len + 4 + pad));
  header += name;
  if (zip64_len != 0) {
    put_le<std::uint16_t>(header, zip::kZip64ExtraId);
    put_le<std::uint16_t>(header, static_cast<std::uint16_t>(zip64_len - 4));
    if (sizes64) {
      put_le<std::uint64_t>(header, size.value_or(0));
      put_le<std::uint64_t>(header, size.value_or(0));
    }
    if (offset64) put_le<std::uint64_t>(header, offset);
  }
  put_le<std::uint16_t>(header, zip::kPaddingExtraId);
  put_le<std::uint16_t>(header, static_cast<std::uint16_t>(pad));
  header.append(static_cast<std::size_t>(pad), 'Z');
  sink_.write(header);

  Open o;
  o.info.name = name;
  o.info.local_header_offset = offset;
  o.info.data_offset = offset + header.size();
  o.info.zip64_local = zip64_len != 0;
  o.declared = size;
  open_ = std::move(o);
}

void ZipWriter::write(ByteSpan data) { write_record_bytes(data, /*borrowed=*/false); }

void ZipWriter::write_borrowed(ByteSpan data) { write_record_bytes(data, /*borrowed=*/true); }

void ZipWriter::write_record_bytes(ByteSpan data, bool borrowed) {
  if (!open_) throw UsageError("ZipWriter: write() with no open record");
  if (open_->declared && data.size() > *open_->declared - open_->written) {
    throw UsageError("ZipWriter: record \"" + open_->info.name + "\" declared " + std::to_string(*open_->declared) +
                     " bytes; writing " + std::to_string(open_->written + data.size()));
  }
  if (data.empty()) return;
  open_->crc = crc32(open_->crc, data);
  open_->written += data.size();
  if (borrowed) {
    sink_.write_borrowed(data);
  } else {
    sink_.write(data);
  }
}

void ZipWriter::end_record() {
  if (!open_) throw UsageError("ZipWriter: end_record() with no open record");
  if (open_->declared && open_->written != *open_->declared) {
    throw UsageError("ZipWriter: record \"" + open_->info.name + "\" declared " + std::to_string(*open_->declared) +
                     " bytes, got " + std::to_string(open_->written));
  }
  ZipRecordInfo info = std::move(open_->info);
  info.crc32 = open_->crc;
  info.size = open_->written;
  open_.reset();
  std::string dd;
  put_le<std::uint32_t>(dd, zip::kDataDescriptorSig);
  put_le<std::uint32_t>(dd, info.crc32);
  if (info.zip64_local || needs_zip64(info.size)) {
    put_le<std::uint64_t>(dd, info.size);
    put_le<std::uint64_t>(dd, info.size);
  } else {
    put_le<std::uint32_t>(dd, static_cast<std::uint32_t>(info.size));
    put_le<std::uint32_t>(dd, static_cast<std::uint32_t>(info.size));
  }
  sink_.write(dd);
  records_.push_back(std::move(info));
}

void ZipWriter::write_record(const std::string& name, ByteSpan data) {
  begin_record(name, data.size());
  write(data);
  end_record();
}

void ZipWriter::finish() {
  if (finished_) throw UsageError("ZipWriter: finish() called twice");
  if (open_) throw UsageError("ZipWriter: finish() while \"" + open_->info.name + "\" is open");
  finished_ = true;
  const bool force = options_.force_zip64;
  const std::uint64_t cd_offset = archive_size();
  std::string out;
  for (const ZipRecordInfo& r : records_) {
    const bool sizes64 = force || needs_zip64(r.size);
    const bool offset64 = force || needs_zip64(r.local_header_offset);
    std::uint16_t extra_len =
        (sizes64 || offset64) ? static_cast<std::uint16_t>(4 + (sizes64 ? 16 : 0) + (offset64 ? 8 : 0)) : 0;
    put_le<std::uint32_t>(out, zip::kCentralHeaderSig);
    put_le<std::uint16_t>(out, 0);                        // made by
    put_le<std::uint16_t>(out, extra_len != 0 ? 45 : 0);  // needed
    put_le<std::uint16_t>(out, zip::kFlagDataDescriptor | zip::kFlagUtf8);
    put_le<std::uint16_t>(out, zip::kMethodStored);
    put_le<std::uint32_t>(out, 0);  // time, date
    put_le<std::uint32_t>(out, r.crc32);
    put_le<std::uint32_t>(out, sizes64 ? zip::kU32Max : static_cast<std::uint32_t>(r.size));
    put_le<std::uint32_t>(out, sizes64 ? zip::kU32Max : static_cast<std::uint32_t>(r.size));
    put_le<std::uint16_t>(out, static_cast<std::uint16_t>(r.name.size()));
    put_le<std::uint16_t>(out, extra_len);
    put_le<std::uint16_t>(out, 0);  // comment
    put_le<std::uint16_t>(out, 0);  // disk
    put_le<std::uint16_t>(out, 0);  // internal attributes
    put_le<std::uint32_t>(out, 0);  // external attributes
    put_le<std::uint32_t>(out, offset64 ? zip::kU32Max : static_cast<std::uint32_t>(r.local_header_offset));
    out += r.name;
    if (extra_len != 0) {
      put_le<std::uint16_t>(out, zip::kZip64ExtraId);
      put_le<std::uint16_t>(out, static_cast<std::uint16_t>(extra_len - 4));
      if (sizes64) {
        put_le<std::uint64_t>(out, r.size);
        put_le<std::uint64_t>(out, r.size);
      }
      if (offset64) put_le<std::uint64_t>(out, r.local_header_offset);
    }
    if (out.size() >= (1u << 20)) {
      sink_.write(out);
      out.clear();
    }
  }
  sink_.write(out);
  out.clear();
  const std::uint64_t cd_size = archive_size() - cd_offset;
  const std::uint64_t count = records_.size();
  const std::uint64_t eocd64_offset = cd_offset + cd_size;

  put_le<std::uint32_t>(out, zip::kEocd64Sig);
  put_le<std::uint64_t>(out, zip::kEocd64Size - 12);
  put_le<std::uint16_t>(out, 0x031e);  // made by (as miniz)
  put_le<std::uint16_t>(out, 45);      // needed: zip64
  put_le<std::uint32_t>(out, 0);       // disk
  put_le<std::uint32_t>(out, 0);       // cd disk
  put_le<std::uint64_t>(out, count);
  put_le<std::uint64_t>(out, count);
  put_le<std::uint64_t>(out, cd_size);
  put_le<std::uint64_t>(out, cd_offset);

  put_le<std::uint32_t>(out, zip::kEocd64LocatorSig);
  put_le<std::uint32_t>(out, 0);
  put_le<std::uint64_t>(out, eocd64_offset);
  put_le<std::uint32_t>(out, 1);

  auto u16_or_max = [&](std::uint64_t v) {
    return force || v >= zip::kU16Max ? zip::kU16Max : static_cast<std::uint16_t>(v);
  };
  auto u32_or_max = [&](std::uint64_t v) {
    return force || needs_zip64(v) ? zip::kU32Max : static_cast<std::uint32_t>(v);
  };
  put_le<std::uint32_t>(out, zip::kEocdSig);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint16_t>(out, u16_or_max(count));
  put_le<std::uint16_t>(out, u16_or_max(count));
  put_le<std::uint32_t>(out, u32_or_max(cd_size));
  put_le<std::uint32_t>(out, u32_or_max(cd_offset));
  put_le<std::uint16_t>(out, 0);  // comment
  sink_.write(out);
}

}  // namespace shardpoint::torchfile
