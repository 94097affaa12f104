#include "engine/lightning_meta.h"

#include "engine/zip_crc_ledger.h"
#include "shardpoint/byte_stream.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {

std::optional<LightningMeta> read_lightning_meta(storage::Storage& folder, bool check_crc) {
  std::optional<std::string> bytes = folder.try_read_all(kLightningMetaName);
  if (!bytes) return std::nullopt;
  LightningMeta meta;
  meta.bytes = std::move(*bytes);
  if (check_crc) {
    // Both name the file in their messages: the source by its name, the checks by `name`.
    const std::string name = folder.describe_key(kLightningMetaName);
    MemorySource source(as_bytes(meta.bytes), name);
    torchfile::ZipArchive archive(source);
    meta.crc = check_records_but(archive, "", 0, name);
  }
  return meta;
}

void publish_lightning_meta(storage::Storage& folder, const LightningMeta& meta, bool durable) {
  storage::WriteOptions options;
  options.durable = durable;
  folder.write_atomic(kLightningMetaName, as_bytes(meta.bytes), options);
}

}  // namespace shardpoint::engine
