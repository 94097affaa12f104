// The C API's tools (what the CLI does): consolidate, reshard and verify, with options and
// results as size-versioned structs, and the names of their enums
// (include/shardpoint/c_api.h). sp_inspect is in c_api_inspect.cc.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/c_api_util.h"
#include "engine/block_checksum.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/reshard.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "shardpoint/verify.h"

namespace {

using namespace shardpoint;
using namespace shardpoint::capi;

constexpr engine::ChecksumAlgorithm kChecksums[] = {
    engine::ChecksumAlgorithm::kNone, engine::ChecksumAlgorithm::kCrc32c, engine::ChecksumAlgorithm::kXxh3};
constexpr engine::CheckpointKind kCheckpointKinds[] = {
    engine::CheckpointKind::kDcp, engine::CheckpointKind::kHfSafetensors, engine::CheckpointKind::kTorchSave};

// The C enums of layouts, compressions and formats are the engine's, value for value.
static_assert(static_cast<int>(engine::ConsolidateLayout::kTrainer) == SP_LAYOUT_TRAINER &&
              static_cast<int>(engine::ConsolidateLayout::kFabric) == SP_LAYOUT_FABRIC &&
              static_cast<int>(engine::ConsolidateLayout::kDcp) == SP_LAYOUT_DCP);
static_assert(static_cast<int>(engine::Compression::kNone) == SP_COMPRESSION_NONE &&
              static_cast<int>(engine::Compression::kZstd) == SP_COMPRESSION_ZSTD);
static_assert(static_cast<int>(engine::ConsolidateFormat::kTorchSave) == SP_FORMAT_TORCH &&
              static_cast<int>(engine::ConsolidateFormat::kSafetensors) == SP_FORMAT_SAFETENSORS &&
              static_cast<int>(engine::ConsolidateFormat::kHfSafetensors) == SP_FORMAT_HF_SAFETENSORS);

// The engine's name of value `value` of `kind`; nullopt for a value the kind lacks.
std::optional<std::string_view> name_of(sp_name_kind kind, int value) {
  if (value < 0 || value > 2) return std::nullopt;
  switch (kind) {
    case SP_NAME_CHECKSUM: return engine::checksum_algorithm_name(kChecksums[value]);
    case SP_NAME_COMPRESSION:
      if (value > SP_COMPRESSION_ZSTD) return std::nullopt;
      return engine::compression_name(static_cast<engine::Compression>(value));
    case SP_NAME_LAYOUT: return engine::consolidate_layout_name(static_cast<engine::ConsolidateLayout>(value));
    case SP_NAME_OUTPUT_FORMAT: return engine::consolidate_format_name(static_cast<engine::ConsolidateFormat>(value));
    case SP_NAME_CHECKPOINT_FORMAT: return engine::checkpoint_kind_name(kCheckpointKinds[value]);
  }
  return std::nullopt;
}

engine::ConsolidateLayout layout_of(int value) {
  const std::optional<std::string_view> name = name_of(SP_NAME_LAYOUT, value);
  if (!name) throw UsageError("consolidate options: unknown layout " + std::to_string(value));
  return static_cast<engine::ConsolidateLayout>(value);
}

engine::ConsolidateFormat format_of(int value) {
  const std::optional<std::string_view> name = name_of(SP_NAME_OUTPUT_FORMAT, value);
  if (!name) throw UsageError("consolidate options: unknown format " + std::to_string(value));
  return static_cast<engine::ConsolidateFormat>(value);
}

sp_zip_crc_counts zip_crc_of(const engine::ZipCrcCounts& c) {
  return sp_zip_crc_counts{c.records_checked, c.bytes_checked, c.records_no_checksum, c.records_partial};
}

// Checks that the caller's result struct reaches past `end` (where the fields the library
// allocates for lie), so nothing it allocates is lost.
void require_result(const void* result, std::size_t struct_size, std::size_t end) {
  require(result != nullptr, "result is NULL");
  require(struct_size >= end, "result struct_size too small");
}

// What an sp_verify_result points into.
struct VerifyResultOwner {
  engine::VerifyReport report;
  std::vector<std::string> sidecar_names;
  std::vector<sp_verify_problem> problems;
  std::vector<sp_verify_coverage> coverage;
};

}  // namespace

extern "C" {

sp_status sp_value_of_name(sp_name_kind kind, const char* name, int* value, char** error) {
  return guarded(error, [&] {
    require(value != nullptr, "value is NULL");
    const std::string n = str(name, "name is NULL");
    switch (kind) {
      case SP_NAME_CHECKSUM:
        for (engine::ChecksumAlgorithm a : kChecksums) {
          if (engine::checksum_algorithm_name(a) == n) {
            *value = checksum_value(a);
            return;
          }
        }
        throw UsageError("checksum: expected one of none, crc32c, xxh3, found \"" + n + "\"");
      case SP_NAME_COMPRESSION: *value = static_cast<int>(engine::compression_from_name(n, "compression")); return;
      case SP_NAME_LAYOUT: *value = static_cast<int>(engine::consolidate_layout_from_name(n, "layout")); return;
      case SP_NAME_OUTPUT_FORMAT: *value = static_cast<int>(engine::consolidate_format_from_name(n, "format")); return;
      case SP_NAME_CHECKPOINT_FORMAT:
        for (int v = 0; v < 3; ++v) {
          if (engine::checkpoint_kind_name(kCheckpointKinds[v]) == n) {
            *value = v;
            return;
          }
        }
        throw UsageError("checkpoint format: expected one of dcp, hf-safetensors, torch, found \"" + n + "\"");
    }
    throw UsageError("unknown name kind " + std::to_string(static_cast<int>(kind)));
  });
}

const char* sp_name_of_value(sp_name_kind kind, int value) {
  const std::optional<std::string_view> name = name_of(kind, value);
  return name ? name->data() : nullptr;  // the engine's names are NUL-terminated literals
}

void sp_consolidate_options_init(sp_consolidate_options* options) {
  if (!reset_sized(options)) return;
  const engine::ConsolidateOptions d;
  options->output_file = nullptr;
  options->layout = static_cast<int>(d.layout);
  options->format = static_cast<int>(d.format);
  options->max_shard_bytes = d.max_shard_bytes;
  options->memory_budget_bytes = d.memory_budget_bytes;
  options->verify_checksums = d.verify_checksums ? 1 : 0;
  options->check_zip_crc = d.check_zip_crc ? 1 : 0;
  options->durable = d.durable ? 1 : 0;
}

void sp_consolidate_result_init(sp_consolidate_result* result) { reset_sized(result); }

void sp_consolidate_result_free(sp_consolidate_result* result) {
  if (result == nullptr || result->struct_size < offsetof(sp_consolidate_result, output) + sizeof(char*)) return;
  std::free(result->output);
  result->output = nullptr;
}

sp_status sp_consolidate(const char* checkpoint_folder, const sp_consolidate_options* options,
                         sp_consolidate_result* result, char** error) {
  return guarded(error, [&] {
    require_result(result, result ? result->struct_size : 0, offsetof(sp_consolidate_result, output) + sizeof(char*));
    result->output = nullptr;
    const sp_consolidate_options o = read_options(options, &sp_consolidate_options_init);
    engine::ConsolidateOptions in;
    in.checkpoint_folder = Location::parse(str(checkpoint_folder, "checkpoint_folder is NULL"));
    if (o.output_file != nullptr && *o.output_file != '\0') in.output_file = Location::parse(o.output_file);
    in.layout = layout_of(o.layout);
    in.format = format_of(o.format);
    in.max_shard_bytes = o.max_shard_bytes;
    in.memory_budget_bytes = o.memory_budget_bytes;
    in.verify_checksums = o.verify_checksums != 0;
    in.check_zip_crc = o.check_zip_crc != 0;
    in.durable = o.durable != 0;
    const engine::ConsolidateReport r = engine::consolidate(in);
    sp_consolidate_result full{};
    full.output = copy_string_or_throw(r.output.to_string());
    full.tensors = r.tensors;
    full.objects = r.objects;
    full.tensor_bytes = r.tensor_bytes;
    full.bytes_read = r.bytes_read;
    full.peak_rss_bytes = r.peak_rss_bytes;
    full.zip_crc = zip_crc_of(r.zip_crc);
    full.seconds = r.seconds;
    write_result(result, full);
  });
}

void sp_reshard_options_init(sp_reshard_options* options) {
  if (!reset_sized(options)) return;
  const engine::ReshardOptions d;
  options->verify_checksums = d.verify_checksums ? 1 : 0;
  options->check_zip_crc = d.check_zip_crc ? 1 : 0;
  options->memory_budget_bytes = d.memory_budget_bytes;
  options->thread_count = d.save.thread_count;
  options->durable = d.save.durable ? 1 : 0;
  options->checksum = checksum_value(d.save.checksum);
  options->compression = d.save.compression == engine::Compression::kZstd ? SP_COMPRESSION_ZSTD : SP_COMPRESSION_NONE;
  options->compression_level = d.save.compression_level;
  options->compression_threads = d.save.compression_threads;
}

void sp_reshard_result_init(sp_reshard_result* result) { reset_sized(result); }

sp_status sp_reshard(const char* source, const char* destination, int ranks, const sp_reshard_options* options,
                     sp_reshard_result* result, char** error) {
  return guarded(error, [&] {
    require_result(result, result ? result->struct_size : 0, sizeof(result->struct_size));
    require(ranks >= 1, "ranks must be >= 1");
    const sp_reshard_options o = read_options(options, &sp_reshard_options_init);
    engine::ReshardOptions in;
    in.ranks = ranks;
    in.verify_checksums = o.verify_checksums != 0;
    in.check_zip_crc = o.check_zip_crc != 0;
    in.memory_budget_bytes = o.memory_budget_bytes;
    in.save.thread_count = std::max(o.thread_count, 1);
    in.save.durable = o.durable != 0;
    if (o.checksum < SP_CHECKSUM_NONE || o.checksum > SP_CHECKSUM_XXH3) {
      throw UsageError("reshard options: unknown checksum " + std::to_string(o.checksum));
    }
    in.save.checksum = kChecksums[o.checksum];
    switch (o.compression) {
      case SP_COMPRESSION_NONE: in.save.compression = engine::Compression::kNone; break;
      case SP_COMPRESSION_ZSTD: in.save.compression = engine::Compression::kZstd; break;
      default: throw UsageError("reshard options: unknown compression " + std::to_string(o.compression));
    }
    in.save.compression_level = o.compression_level;
    in.save.compression_threads = o.compression_threads;
    auto dst = storage::open_storage(location_arg(destination, "destination is NULL"));
    const engine::ReshardReport r = engine::reshard(location_arg(source, "source is NULL"), *dst, in);
    sp_reshard_result full{};
    full.source_format = checkpoint_format_value(r.source_format);
    full.tensors = r.tensors;
    full.objects = r.objects;
    full.payload_bytes = r.payload_bytes;
    full.bytes_written = r.bytes_written;
    full.zip_crc = zip_crc_of(r.zip_crc);
    full.meta_pt_bytes = r.meta_pt_bytes;
    full.seconds = r.seconds;
    write_result(result, full);
  });
}

void sp_verify_options_init(sp_verify_options* options) {
  if (!reset_sized(options)) return;
  options->quick = engine::VerifyOptions{}.quick ? 1 : 0;
}

void sp_verify_result_init(sp_verify_result* result) { reset_sized(result); }

void sp_verify_result_free(sp_verify_result* result) {
  if (result == nullptr || result->struct_size < offsetof(sp_verify_result, owner) + sizeof(void*)) return;
  delete static_cast<VerifyResultOwner*>(result->owner);
  result->owner = nullptr;
  if (result->struct_size >= sizeof(sp_verify_result)) {
    result->problems = nullptr;
    result->problem_count = 0;
    result->coverage = nullptr;
    result->coverage_count = 0;
  }
}

sp_status sp_verify(const char* path_or_url, const sp_verify_options* options, sp_verify_result* result, char** error) {
  return guarded(error, [&] {
    require_result(result, result ? result->struct_size : 0, offsetof(sp_verify_result, owner) + sizeof(void*));
    result->owner = nullptr;
    const sp_verify_options o = read_options(options, &sp_verify_options_init);
    engine::VerifyOptions in;
    in.quick = o.quick != 0;
    auto owner = std::make_unique<VerifyResultOwner>();
    owner->report = engine::verify(location_arg(path_or_url, "path_or_url is NULL"), in);
    const engine::VerifyReport& r = owner->report;
    for (const engine::VerifyProblem& p : r.problems) {
      owner->problems.push_back(sp_verify_problem{p.file.c_str(), p.item.c_str(), p.message.c_str()});
    }
    for (const engine::VerifyCoverage& c : r.coverage) {
      owner->coverage.push_back(sp_verify_coverage{c.name.c_str(), checkpoint_format_value(c.kind), c.quick ? 1 : 0,
                                                   c.bytes, c.records, c.record_bytes, c.zip_crc32_bytes,
                                                   c.no_checksum_bytes, checksum_value(c.sidecar), c.sidecar_bytes});
    }
    sp_verify_result full{};
    full.ok = r.ok() ? 1 : 0;
    full.tensors = r.tensors;
    full.objects = r.objects;
    full.bytes = r.bytes;
    full.verified_bytes = r.verified_bytes;
    full.problem_count = owner->problems.size();
    full.problems = owner->problems.data();
    full.coverage_count = owner->coverage.size();
    full.coverage = owner->coverage.data();
    full.owner = owner.release();
    write_result(result, full);
  });
}

}  // extern "C"
