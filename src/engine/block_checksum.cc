#include "engine/block_checksum.h"

#include <charconv>
#include <cstdio>

#include "core/checksum.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

std::string_view checksum_algorithm_name(ChecksumAlgorithm algorithm) {
  switch (algorithm) {
    case ChecksumAlgorithm::kNone: return "none";
    case ChecksumAlgorithm::kCrc32c: return "crc32c";
    case ChecksumAlgorithm::kXxh3: return "xxh3";
  }
  return "none";
}

ChecksumAlgorithm checksum_algorithm_from_name(std::string_view name, std::string_view source) {
  if (name == "crc32c") return ChecksumAlgorithm::kCrc32c;
  if (name == "xxh3") return ChecksumAlgorithm::kXxh3;
  if (name == "none") return ChecksumAlgorithm::kNone;
  throw FormatError(std::string(source) + ": unknown checksum algorithm \"" + std::string(name) +
                    "\" (expected crc32c, xxh3 or none)");
}

std::uint64_t checksum_of(ChecksumAlgorithm algorithm, ByteSpan data) {
  switch (algorithm) {
    case ChecksumAlgorithm::kCrc32c: return crc32c(0, data);
    case ChecksumAlgorithm::kXxh3: return xxh3_64(data);
    case ChecksumAlgorithm::kNone: break;
  }
  return 0;
}

std::string checksum_to_hex(ChecksumAlgorithm algorithm, std::uint64_t value) {
  char buf[24];
  if (algorithm == ChecksumAlgorithm::kXxh3) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  } else {
    std::snprintf(buf, sizeof buf, "%08llx", static_cast<unsigned long long>(value & 0xffffffffu));
  }
  return buf;
}

std::optional<std::uint64_t> parse_checksum_hex(ChecksumAlgorithm algorithm, std::string_view hex) {
  const std::size_t digits = algorithm == ChecksumAlgorithm::kXxh3 ? 16 : 8;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
  if (hex.size() != digits || ec != std::errc() || end != hex.data() + hex.size()) return std::nullopt;
  return value;
}

std::uint64_t checksum_from_hex(ChecksumAlgorithm algorithm, std::string_view hex, std::string_view what) {
  if (std::optional<std::uint64_t> value = parse_checksum_hex(algorithm, hex)) return *value;
  const std::size_t digits = algorithm == ChecksumAlgorithm::kXxh3 ? 16 : 8;
  throw FormatError(std::string(what) + ": expected " + std::to_string(digits) + " hex digits, found \"" +
                    std::string(hex) + "\"");
}

StreamingChecksum::StreamingChecksum(ChecksumAlgorithm algorithm) : algorithm_(algorithm) { reset(); }

void StreamingChecksum::update(ByteSpan data) {
  if (algorithm_ == ChecksumAlgorithm::kCrc32c) crc_ = crc32c(crc_, data);
  if (xxh3_) xxh3_->update(data);
}

std::uint64_t StreamingChecksum::value() const {
  if (xxh3_) return xxh3_->digest();
  return algorithm_ == ChecksumAlgorithm::kCrc32c ? crc_ : 0;
}

void StreamingChecksum::reset() {
  crc_ = 0;
  if (algorithm_ != ChecksumAlgorithm::kXxh3) return;
  if (xxh3_) {
    xxh3_->reset();  // once per block: keep the state's memory
  } else {
    xxh3_ = std::make_unique<Xxh3>();
  }
}

BlockChecksummer::BlockChecksummer(ChecksumAlgorithm algorithm, std::uint64_t block_size)
    : algorithm_(algorithm), block_size_(block_size), block_(algorithm) {
  if (block_size == 0) throw UsageError("BlockChecksummer: block size 0");
  if (algorithm_ == ChecksumAlgorithm::kXxh3) xxh3_item_ = std::make_unique<StreamingChecksum>(algorithm);
}

BlockChecksummer::~BlockChecksummer() = default;

void BlockChecksummer::close_block() {
  if (in_block_ == 0) return;
  const std::uint64_t value = block_.value();
  blocks_.push_back(value);
  if (algorithm_ == ChecksumAlgorithm::kCrc32c) {
    crc_item_ = crc32c_combine(crc_item_, static_cast<std::uint32_t>(value), in_block_);
  }
  block_.reset();
  in_block_ = 0;
}

void BlockChecksummer::update(ByteSpan data) {
  if (finished_) throw UsageError("BlockChecksummer::update after finish_item");
  if (algorithm_ == ChecksumAlgorithm::kNone) {
    length_ += data.size();
    return;
  }
  if (xxh3_item_) xxh3_item_->update(data);
  while (!data.empty()) {
    const std::uint64_t room = block_size_ - in_block_;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(room, data.size()));
    block_.update(data.first(n));
    in_block_ += n;
    length_ += n;
    data = data.subspan(n);
    if (in_block_ == block_size_) close_block();
  }
}

std::uint64_t BlockChecksummer::finish_item() {
  if (finished_) throw UsageError("BlockChecksummer::finish_item called twice");
  finished_ = true;
  close_block();
  if (xxh3_item_) return xxh3_item_->value();
  return algorithm_ == ChecksumAlgorithm::kCrc32c ? crc_item_ : 0;
}

std::vector<std::uint64_t> BlockChecksummer::take_blocks() { return std::move(blocks_); }

std::string block_checksum_mismatch(const std::string& where, ChecksumAlgorithm algorithm, std::uint64_t block,
                                    std::uint64_t begin, std::uint64_t end, std::uint64_t expected,
                                    std::uint64_t found) {
  return where + ": checksum mismatch in block " + std::to_string(block) + " (blob bytes [" + std::to_string(begin) +
         ", " + std::to_string(end) + ")): expected " + std::string(checksum_algorithm_name(algorithm)) + " " +
         checksum_to_hex(algorithm, expected) + ", found " + checksum_to_hex(algorithm, found);
}

}  // namespace shardpoint::engine
