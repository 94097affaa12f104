// The one mapping between the engine's option enums and their names, shared by the CLI and
// the C API: consolidate's layout and format (shardpoint/consolidate.h), the item compression
// (shardpoint/checkpoint.h).
#include <array>
#include <string>
#include <utility>

#include "shardpoint/checkpoint.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

constexpr std::array<std::pair<ConsolidateLayout, std::string_view>, 3> kLayouts = {{
    {ConsolidateLayout::kTrainer, "trainer"},
    {ConsolidateLayout::kFabric, "fabric"},
    {ConsolidateLayout::kDcp, "dcp"},
}};

constexpr std::array<std::pair<ConsolidateFormat, std::string_view>, 3> kFormats = {{
    {ConsolidateFormat::kTorchSave, "torch"},
    {ConsolidateFormat::kSafetensors, "safetensors"},
    {ConsolidateFormat::kHfSafetensors, "hf-safetensors"},
}};

constexpr std::array<std::pair<Compression, std::string_view>, 2> kCompressions = {{
    {Compression::kNone, "none"},
    {Compression::kZstd, "zstd"},
}};

template <typename Enum, std::size_t N>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, N>& table, Enum value) {
  for (const auto& [v, name] : table) {
    if (v == value) return name;
  }
  return "?";
}

template <typename Enum, std::size_t N>
Enum value_of(const std::array<std::pair<Enum, std::string_view>, N>& table, std::string_view name,
              std::string_view what) {
  std::string accepted;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    accepted += accepted.empty() ? "" : ", ";
    accepted += n;
  }
  throw UsageError(std::string(what) + ": expected one of " + accepted + ", found \"" + std::string(name) + "\"");
}

}  // namespace

std::string_view consolidate_layout_name(ConsolidateLayout layout) { return name_of(kLayouts, layout); }

ConsolidateLayout consolidate_layout_from_name(std::string_view name, std::string_view what) {
  return value_of(kLayouts, name, what);
}

std::string_view consolidate_format_name(ConsolidateFormat format) { return name_of(kFormats, format); }

ConsolidateFormat consolidate_format_from_name(std::string_view name, std::string_view what) {
  return value_of(kFormats, name, what);
}

std::string_view compression_name(Compression compression) { return name_of(kCompressions, compression); }

Compression compression_from_name(std::string_view name, std::string_view what) {
  return value_of(kCompressions, name, what);
}

}  // namespace shardpoint::engine
