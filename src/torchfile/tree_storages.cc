#include "torchfile/tree_storages.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "pickle/reader.h"
#include "pickle/tree_edit.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Storage bytes are copied through a buffer of this size: a multiple of every swap width.
constexpr std::uint64_t kCopyBytes = std::uint64_t{4} << 20;
static_assert(kCopyBytes % 16 == 0);

std::size_t swap_width_of(DType dtype) {
  const std::size_t itemsize = dtype_itemsize(dtype);
  const bool complex = dtype == DType::kComplex32 || dtype == DType::kComplex64 || dtype == DType::kComplex128;
  return complex ? itemsize / 2 : itemsize;
}

}  // namespace

StorageRef parse_storage_pid(const pickle::Value& node, const std::string& where) {
  auto fail = [&](const std::string& detail) -> void {
    throw FormatError(where + ": persistent id " + detail + "; expected ('storage', type, key, location, numel)");
  };
  if (!node.is(Kind::kPersistentId) || !node.pid() || !node.pid()->is(Kind::kTuple)) fail("is not a tuple");
  const auto& p = node.pid()->items();
  if (p.size() != 5 || std::any_of(p.begin(), p.end(), [](const ValuePtr& x) { return !x; })) {
    fail("has " + std::to_string(p.size()) + " items");
  }
  if (!p[0]->is(Kind::kStr) || p[0]->as_string() != "storage") fail("does not start with 'storage'");
  if (!p[1]->is(Kind::kGlobal)) fail("has no storage type global");
  if (!p[3]->is(Kind::kStr)) fail("has no str location");
  if (!p[4]->is(Kind::kInt) || !p[4]->int_fits_int64() || p[4]->as_int() < 0) fail("has no non-negative int numel");
  StorageRef ref;
  if (p[2]->is(Kind::kStr)) {
    ref.key = p[2]->as_string();
  } else if (p[2]->is(Kind::kInt) && p[2]->int_fits_int64()) {
    ref.key = std::to_string(p[2]->as_int());
  } else {
    fail("has no str key");
  }
  ref.type_name = p[1]->name();
  std::size_t itemsize = 1;
  if (ref.type_name != "UntypedStorage") {
    const std::optional<DType> dtype = dtype_of_storage_type(ref.type_name);
    if (!dtype) fail("names the unsupported storage type " + p[1]->module() + "." + ref.type_name);
    itemsize = dtype_itemsize(*dtype);
    ref.swap_width = swap_width_of(*dtype);
  }
  const auto numel = static_cast<std::uint64_t>(p[4]->as_int());
  if (numel > std::numeric_limits<std::uint64_t>::max() / itemsize) fail("has a numel that overflows");
  ref.nbytes = numel * itemsize;
  return ref;
}

pickle::ValuePtr rename_storage_pid(const pickle::Value& node, const pickle::ValuePtr& key) {
  std::vector<ValuePtr> items = node.pid()->items();
  items[2] = key;
  return Value::persistent_id(Value::tuple(std::move(items)));
}

std::vector<RenamedStorage> renumber_storages(pickle::ValuePtr& root, const std::string& where, std::size_t first_key) {
  std::vector<RenamedStorage> out;
  // Source key -> the str node of its new key, shared by every reference (as torch.save's
  // pickler memoizes the one key string), so the pickle is the one torch.save writes.
  std::map<std::string, ValuePtr> new_key;
  pickle::replace_nodes(root, [&](const ValuePtr& node) -> ValuePtr {
    if (!node->is(Kind::kPersistentId)) return nullptr;
    StorageRef ref = parse_storage_pid(*node, where);
    const ValuePtr& old_key = node->pid()->items()[2];
    auto [it, inserted] = new_key.try_emplace(ref.key, nullptr);
    if (inserted) {
      const std::string key = std::to_string(first_key + out.size());
      // A key that stays the same keeps its node (and its sharing with the source's tree).
      it->second = old_key->is(Kind::kStr) && old_key->as_string() == key ? old_key : Value::str(key);
      out.push_back(RenamedStorage{ref, key});
    }
    if (it->second == old_key) return nullptr;
    return rename_storage_pid(*node, it->second);
  });
  return out;
}

void read_storage_bytes(const TorchFile& file, const StorageRef& ref, std::uint64_t at, std::span<std::byte> dest) {
  const std::string where = file.source().name() + ": storage \"" + ref.key + "\"";
  const ZipEntry* record = file.record("data/" + ref.key);
  if (record == nullptr) {
    throw FormatError(where + ": record \"" + file.archive_name() + "/data/" + ref.key + "\" is missing");
  }
  const ByteRange range = file.archive().data_range(*record);
  if (range.size < ref.nbytes) {
    throw FormatError(where + ": expected " + std::to_string(ref.nbytes) + " bytes (" + ref.type_name + "), record \"" +
                      record->name + "\" has " + std::to_string(range.size));
  }
  file.source().read(range.offset + at, dest, "storage \"" + ref.key + "\"");
  if (file.big_endian() && ref.swap_width > 1) {
    for (std::size_t e = 0; e + ref.swap_width <= dest.size(); e += ref.swap_width) {
      std::reverse(dest.begin() + static_cast<std::ptrdiff_t>(e),
                   dest.begin() + static_cast<std::ptrdiff_t>(e + ref.swap_width));
    }
  }
}

void write_object_with_storages(TorchSaveWriter& writer, const pickle::Value& object, const TorchFile& file) {
  const std::string where = file.source().name();
  // A private copy to renumber: the file's tree stays as it is for other readers.
  const std::string pickled = pickle::pickle_to_string(object);
  ValuePtr copy = pickle::read_pickle(ByteSpan(reinterpret_cast<const std::byte*>(pickled.data()), pickled.size()),
                                      where + " (object copy)");
  const std::vector<RenamedStorage> storages = renumber_storages(copy, where);
  writer.write_pickle(*copy);
  std::vector<std::byte> buffer;
  for (const RenamedStorage& s : storages) {
    writer.begin_storage(s.key, s.source.nbytes);
    for (std::uint64_t at = 0; at < s.source.nbytes; at += kCopyBytes) {
      const auto n = static_cast<std::size_t>(std::min(kCopyBytes, s.source.nbytes - at));
      buffer.resize(n);
      read_storage_bytes(file, s.source, at, buffer);
      writer.write(buffer);
    }
    writer.end_storage();
  }
}

}  // namespace shardpoint::torchfile
