#include "torchfile/torch_save_writer.h"

#include <cstdio>
#include <functional>
#include <unordered_set>

#include "pickle/writer.h"
#include "shardpoint/error.h"
#include "torchfile/torch_file.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

std::string_view legacy_storage_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return "DoubleStorage";
    case DType::kFloat32: return "FloatStorage";
    case DType::kFloat16: return "HalfStorage";
    case DType::kBFloat16: return "BFloat16Storage";
    case DType::kInt64: return "LongStorage";
    case DType::kInt32: return "IntStorage";
    case DType::kInt16: return "ShortStorage";
    case DType::kInt8: return "CharStorage";
    case DType::kUInt8: return "ByteStorage";
    case DType::kBool: return "BoolStorage";
    case DType::kComplex128: return "ComplexDoubleStorage";
    case DType::kComplex64: return "ComplexFloatStorage";
    default: return {};
  }
}

std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t value) {
  return seed ^ (value + 0x9e3779b9 + (seed << 6) + (seed >> 2));
}

// Forwards pickle bytes into the open zip record.
class RecordSink final : public ByteSink {
 public:
  explicit RecordSink(ZipWriter& zip) : zip_(zip) {}
  void write(ByteSpan data) override {
    zip_.write(data);
    pos_ += data.size();
  }
  using ByteSink::write;
  std::uint64_t position() const override { return pos_; }

 private:
  ZipWriter& zip_;
  std::uint64_t pos_ = 0;
};

// Calls fn(pid tuple) for every storage persistent id in the tree.
void for_each_storage_pid(const Value& root, const std::function<void(const Value&)>& fn) {
  std::vector<const Value*> stack{&root};
  std::unordered_set<const Value*> seen;
  auto push = [&](const ValuePtr& p) {
    if (p) stack.push_back(p.get());
  };
  while (!stack.empty()) {
    const Value* v = stack.back();
    stack.pop_back();
    if (!seen.insert(v).second) continue;
    switch (v->kind()) {
      case Kind::kTuple:
      case Kind::kList:
      case Kind::kSet:
      case Kind::kFrozenSet:
        for (const auto& c : v->items()) push(c);
        break;
      case Kind::kDict:
        for (const auto& [k, x] : v->entries()) {
          push(k);
          push(x);
        }
        break;
      case Kind::kObject:
        push(v->callable());
        push(v->args());
        push(v->kwargs());
        push(v->state());
        for (const auto& c : v->items()) push(c);
        for (const auto& [k, x] : v->entries()) {
          push(k);
          push(x);
        }
        break;
      case Kind::kPersistentId:
        if (v->pid()) fn(*v->pid());
        break;
      default: break;
    }
  }
}

}  // namespace

bool uses_legacy_storage(DType dtype) { return !legacy_storage_name(dtype).empty(); }

std::vector<std::int64_t> contiguous_strides(std::span<const std::int64_t> shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

ValuePtr make_tensor_node(DType dtype, std::span<const std::int64_t> shape, std::span<const std::int64_t> strides,
                          std::int64_t storage_offset, const std::string& storage_key, std::uint64_t storage_numel,
                          const std::string& location, bool requires_grad) {
  if (shape.size() != strides.size()) {
    throw UsageError("make_tensor_node: shape has " + std::to_string(shape.size()) + " dims, strides " +
                     std::to_string(strides.size()));
  }
  if (storage_offset < 0) throw UsageError("make_tensor_node: negative storage_offset");
  std::vector<ValuePtr> size_items, stride_items;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) throw UsageError("make_tensor_node: negative size or stride");
    size_items.push_back(Value::integer(shape[i]));
    stride_items.push_back(Value::integer(strides[i]));
  }
  const bool legacy = uses_legacy_storage(dtype);
  const std::uint64_t pid_numel = legacy ? storage_numel : storage_numel * dtype_itemsize(dtype);
  ValuePtr pid = Value::persistent_id(Value::tuple({
      Value::str("storage"),
      legacy ? Value::global("torch", std::string(legacy_storage_name(dtype)))
             : Value::global("torch.storage", "UntypedStorage"),
      Value::str(storage_key),
      Value::str(location),
      Value::integer(static_cast<std::int64_t>(pid_numel)),
  }));
  std::vector<ValuePtr> args{pid,
                             Value::integer(storage_offset),
                             Value::tuple(std::move(size_items)),
                             Value::tuple(std::move(stride_items)),
                             Value::boolean(requires_grad),
                             Value::call("collections", "OrderedDict", {})};
  if (!legacy) args.push_back(Value::global("torch", std::string(dtype_name(dtype))));
  return Value::call("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3", std::move(args));
}

ValuePtr make_parameter_node(ValuePtr tensor, bool requires_grad) {
  return Value::call("torch._utils", "_rebuild_parameter",
                     {std::move(tensor), Value::boolean(requires_grad), Value::call("collections", "OrderedDict", {})});
}

std::string serialization_id(const std::vector<std::pair<std::string, std::uint32_t>>& records) {
  // PyTorch keeps the names in a std::unordered_set and iterates it; same inserts, same
  // implementation, same order.
  std::unordered_set<std::string> names;
  std::uint64_t crc_hash = 0;
  for (const auto& [name, crc] : records) {
    names.insert(name);
    crc_hash = hash_combine(crc_hash, crc);
  }
  std::uint64_t name_hash = 0;
  for (const std::string& n : names) name_hash = hash_combine(name_hash, std::hash<std::string>{}(n));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%020llu%020llu", static_cast<unsigned long long>(name_hash),
                static_cast<unsigned long long>(crc_hash));
  return buf;
}

TorchSaveWriter::TorchSaveWriter(ByteSink& sink, TorchSaveOptions options)
    : options_(std::move(options)), zip_(sink, options_.zip) {
  if (options_.archive_name.empty() || options_.archive_name.find('/') != std::string::npos) {
    throw UsageError("TorchSaveWriter: archive name \"" + options_.archive_name + "\" must be non-empty without '/'");
  }
}

void TorchSaveWriter::write_record(const std::string& name, std::string_view data) {
  zip_.write_record(options_.archive_name + "/" + name, data);
}

void TorchSaveWriter::write_pickle(const pickle::Value& root) {
  if (pickled_ || finished_) throw UsageError("TorchSaveWriter: write_pickle() called twice or after finish()");
  for_each_storage_pid(root, [&](const Value& pid) {
    const auto& p = pid.items();
    if (!pid.is(Kind::kTuple) || p.size() != 5 || !p[0] || !p[0]->is(Kind::kStr) || p[0]->as_string() != "storage" ||
        !p[1] || !p[1]->is(Kind::kGlobal) || !p[2] || !p[2]->is(Kind::kStr) || !p[4] || !p[4]->is(Kind::kInt) ||
        !p[4]->int_fits_int64() || p[4]->as_int() < 0) {
      throw UsageError("TorchSaveWriter: persistent id is not ('storage', type, 'key', location, numel)");
    }
    std::uint64_t itemsize = 1;
    if (p[1]->name() != "UntypedStorage") {
      auto d = dtype_of_storage_type(p[1]->name());
      if (!d) throw UsageError("TorchSaveWriter: unsupported storage type " + p[1]->name());
      itemsize = dtype_itemsize(*d);
    }
    std::uint64_t nbytes = static_cast<std::uint64_t>(p[4]->as_int()) * itemsize;
    std::uint64_t& slot = pending_[p[2]->as_string()];
    slot = std::max(slot, nbytes);
  });
  zip_.begin_record(options_.archive_name + "/data.pkl");
  RecordSink out(zip_);
  pickle::write_pickle(root, out, {.protocol = 2});
  zip_.end_record();
  write_record("byteorder", "little");
  pickled_ = true;
}

void TorchSaveWriter::begin_storage(const std::string& key, std::uint64_t nbytes) {
  if (!pickled_ || finished_)
    throw UsageError("TorchSaveWriter: begin_storage(\"" + key + "\") before write_pickle() or after finish()");
  if (written_.count(key)) throw UsageError("TorchSaveWriter: storage \"" + key + "\" written twice");
  if (options_.check_storages) {
    auto it = pending_.find(key);
    if (it == pending_.end())
      throw UsageError("TorchSaveWriter: storage \"" + key + "\" is not referenced by the pickled tree");
    if (it->second != nbytes) {
      throw UsageError("TorchSaveWriter: storage \"" + key + "\" is " + std::to_string(it->second) +
                       " bytes in the tree, writing " + std::to_string(nbytes));
    }
    pending_.erase(it);
  }
  written_.emplace(key, nbytes);
  zip_.begin_record(options_.archive_name + "/data/" + key, nbytes);
}

void TorchSaveWriter::write(ByteSpan data) { zip_.write(data); }

void TorchSaveWriter::write_borrowed(ByteSpan data) { zip_.write_borrowed(data); }

void TorchSaveWriter::end_storage() { zip_.end_record(); }

void TorchSaveWriter::write_storage(const std::string& key, ByteSpan bytes) {
  begin_storage(key, bytes.size());
  write(bytes);
  end_storage();
}

void TorchSaveWriter::finish() {
  if (!pickled_ || finished_) throw UsageError("TorchSaveWriter: finish() before write_pickle() or twice");
  if (options_.check_storages && !pending_.empty()) {
    throw UsageError("TorchSaveWriter: storage \"" + pending_.begin()->first + "\" (" +
                     std::to_string(pending_.begin()->second) + " bytes) referenced by the tree was not written");
  }
  write_record("version", "3\n");
  std::vector<std::pair<std::string, std::uint32_t>> recs;
  const std::size_t prefix = options_.archive_name.size() + 1;
  for (const ZipRecordInfo& r : zip_.records()) recs.emplace_back(r.name.substr(prefix), r.crc32);
  write_record(".data/serialization_id", serialization_id(recs));
  zip_.finish();
  finished_ = true;
}

}  // namespace shardpoint::torchfile
