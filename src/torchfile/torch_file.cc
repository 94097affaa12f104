#include "torchfile/torch_file.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "pickle/reader.h"
#include "shardpoint/error.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                          0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

enum class RebuildKind { kNone, kTensorV2, kTensorV3, kParameter };

RebuildKind rebuild_kind(const Value& node) {
  if (!node.is(Kind::kObject) || node.call_kind() != pickle::CallKind::kReduce) return RebuildKind::kNone;
  const pickle::ValuePtr& fn = node.callable();
  if (!fn || !fn->is(Kind::kGlobal) || fn->module() != "torch._utils") return RebuildKind::kNone;
  const std::string& n = fn->name();
  if (n == "_rebuild_tensor_v2") return RebuildKind::kTensorV2;
  if (n == "_rebuild_tensor_v3") return RebuildKind::kTensorV3;
  if (n == "_rebuild_parameter" || n == "_rebuild_parameter_with_state") return RebuildKind::kParameter;
  return RebuildKind::kNone;
}

// Multiplies with an overflow check against 2^63.
bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  if (p > static_cast<unsigned __int128>(INT64_MAX)) return false;
  out = static_cast<std::uint64_t>(p);
  return true;
}

void byteswap_elements(std::span<std::byte> data, std::size_t width) {
  if (width <= 1) return;
  for (std::size_t i = 0; i + width <= data.size(); i += width)
    std::reverse(data.begin() + i, data.begin() + i + width);
}

}  // namespace

std::optional<DType> dtype_of_storage_type(std::string_view name) {
  static const std::pair<std::string_view, DType> kTypes[] = {
      {"DoubleStorage", DType::kFloat64},
      {"FloatStorage", DType::kFloat32},
      {"HalfStorage", DType::kFloat16},
      {"BFloat16Storage", DType::kBFloat16},
      {"LongStorage", DType::kInt64},
      {"IntStorage", DType::kInt32},
      {"ShortStorage", DType::kInt16},
      {"CharStorage", DType::kInt8},
      {"ByteStorage", DType::kUInt8},
      {"BoolStorage", DType::kBool},
      {"ComplexDoubleStorage", DType::kComplex128},
      {"ComplexFloatStorage", DType::kComplex64},
  };
  for (const auto& [n, d] : kTypes) {
    if (n == name) return d;
  }
  return std::nullopt;
}

std::uint64_t TensorInfo::numel() const {
  std::uint64_t n = 1;
  for (std::int64_t s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

bool TensorInfo::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::unique_ptr<TorchFile> TorchFile::open(const std::string& path) { return open(MappedSource::open(path)); }

std::unique_ptr<TorchFile> TorchFile::open(std::unique_ptr<ByteSource> source) {
  if (!source) throw UsageError("TorchFile::open: null source");
  std::unique_ptr<TorchFile> file(new TorchFile(std::move(source)));
  file->parse();
  return file;
}

TorchFile::TorchFile(std::unique_ptr<ByteSource> source) : source_(std::move(source)) {}

const ZipEntry* TorchFile::record(std::string_view name) const {
  return archive_->find(archive_name_ + "/" + std::string(name));
}

void TorchFile::parse() {
  const std::string& sname = source_->name();
  // 1. Recognize the container before trusting it to be a zip.
  std::string head =
      source_->read_string(0, std::min<std::uint64_t>(source_->size(), sizeof kLegacyMagic), "file magic");
  if (head.size() == sizeof kLegacyMagic && std::memcmp(head.data(), kLegacyMagic, sizeof kLegacyMagic) == 0) {
    throw FormatError(sname +
                      " is a legacy (pre-1.6) torch.save file; not supported: re-save it with a current PyTorch");
  }
  if (head.compare(0, 8, "PYTORCH1") == 0) {
    throw FormatError(
        sname + " is a pre-1.4 PyTorch archive (PYTORCH1 magic); not supported: re-save it with a current PyTorch");
  }
  if (head.size() < 4 || head.compare(0, 4, "PK\x03\x04") != 0) {
    throw FormatError(sname + ": not a torch.save file: expected zip local header PK\\3\\4 at offset 0, found " +
                      hex_bytes(as_bytes(head)));
  }
  archive_ = std::make_unique<ZipArchive>(*source_);
  const auto& entries = archive_->entries();
  if (entries.empty()) throw FormatError(sname + ": torch.save archive has no records");

  // 2. Every record lives under one folder, named by the first record.
  std::size_t slash = entries[0].name.find('/');
  if (slash == std::string::npos || slash == 0) {
    throw FormatError(sname + ": expected records named \"<archive>/...\", found \"" + entries[0].name + "\"");
  }
  archive_name_ = entries[0].name.substr(0, slash);
  for (const ZipEntry& e : entries) {
    if (e.name.size() <= slash || e.name.compare(0, slash + 1, archive_name_ + "/") != 0) {
      throw FormatError(sname + ": record \"" + e.name + "\" is not under \"" + archive_name_ +
                        "/\" like the first record");
    }
  }

  // 3. version, byteorder.
  const ZipEntry* ver = record("version");
  if (!ver) ver = record(".data/version");
  if (!ver) throw FormatError(sname + ": torch.save archive has no \"" + archive_name_ + "/version\" record");
  if (ver->uncompressed_size > 32) {
    throw FormatError(sname + ": record \"" + ver->name + "\": expected a short decimal, found " +
                      std::to_string(ver->uncompressed_size) + " bytes");
  }
  std::string vtext = archive_->read(*ver);
  while (!vtext.empty() && std::isspace(static_cast<unsigned char>(vtext.back()))) vtext.pop_back();
  bool digits = !vtext.empty() && vtext.size() <= 18 &&
                std::all_of(vtext.begin(), vtext.end(), [](char c) { return c >= '0' && c <= '9'; });
  version_ = digits ? std::stoll(vtext) : -1;
  if (version_ < 1 || version_ > 10) {
    throw FormatError(sname + ": record \"" + ver->name + "\": expected a format version in 1..10, found \"" + vtext +
                      "\"");
  }
  if (const ZipEntry* bo = record("byteorder")) {
    std::string order = bo->uncompressed_size <= 16 ? archive_->read(*bo) : std::string("(long record)");
    if (order == "big") {
      big_endian_ = true;
    } else if (order != "little") {
      throw FormatError(sname + ": record \"" + bo->name + "\": expected \"little\" or \"big\", found \"" + order +
                        "\"");
    }
  }

  // 4. data.pkl: parse in place when mapped.
  const ZipEntry* pkl = record("data.pkl");
  if (!pkl) throw FormatError(sname + ": torch.save archive has no \"" + archive_name_ + "/data.pkl\" record");
  std::optional<ByteSpan> pbytes = archive_->view(*pkl);
  if (!pbytes) {
    pickle_copy_ = archive_->read(*pkl);
    pbytes = as_bytes(pickle_copy_);
  }
  root_ = pickle::read_pickle(*pbytes, sname + ": " + pkl->name);
  find_tensors();
}

void TorchFile::find_tensors() {
  std::vector<const Value*> stack{root_.get()};
  std::unordered_set<const Value*> seen;
  auto push_all = [&](const std::vector<const Value*>& kids) {
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) {
      if (*it != nullptr && !seen.count(*it)) stack.push_back(*it);
    }
  };
  while (!stack.empty()) {
    const Value* v = stack.back();
    stack.pop_back();
    if (!seen.insert(v).second) continue;
    if (rebuild_kind(*v) != RebuildKind::kNone) {
      add_tensor(*v);
      continue;
    }
    std::vector<const Value*> kids;
    switch (v->kind()) {
      case Kind::kTuple:
      case Kind::kList:
      case Kind::kSet:
      case Kind::kFrozenSet:
        for (const auto& c : v->items()) kids.push_back(c.get());
        break;
      case Kind::kDict:
        for (const auto& [k, x] : v->entries()) {
          kids.push_back(k.get());
          kids.push_back(x.get());
        }
        break;
      case Kind::kObject:
        kids.push_back(v->callable().get());
        kids.push_back(v->args().get());
        kids.push_back(v->kwargs().get());
        for (const auto& c : v->items()) kids.push_back(c.get());
        for (const auto& [k, x] : v->entries()) {
          kids.push_back(k.get());
          kids.push_back(x.get());
        }
        kids.push_back(v->state().get());
        break;
      case Kind::kPersistentId: kids.push_back(v->pid().get()); break;
      default: break;
    }
    push_all(kids);
  }
}

const TensorInfo* TorchFile::add_tensor(const Value& node) {
  if (const TensorInfo* known = tensor_of(node)) return known;
  const std::string where =
      source_->name() + ": tensor #" + std::to_string(tensors_.size()) + " in " + archive_name_ + "/data.pkl";
  auto fail = [&](const std::string& detail) -> void { throw FormatError(where + ": " + detail); };
  const RebuildKind kind = rebuild_kind(node);
  const std::string fn = "torch._utils." + node.callable()->name();
  const pickle::ValuePtr& args_ptr = node.args();
  if (!args_ptr || !args_ptr->is(Kind::kTuple)) fail("expected a tuple of arguments to " + fn);
  const auto& args = args_ptr->items();
  auto arg = [&](std::size_t i, Kind k, const char* what) -> const Value& {
    if (i >= args.size() || !args[i] || !args[i]->is(k)) {
      fail("argument " + std::to_string(i) + " (" + what + ") of " + fn + ": expected " +
           std::string(pickle::kind_name(k)) + ", found " +
           (i >= args.size() || !args[i] ? std::string("nothing") : std::string(pickle::kind_name(args[i]->kind()))));
    }
    return *args[i];
  };

  TensorInfo info;
  if (kind == RebuildKind::kParameter) {
    const Value& inner = arg(0, Kind::kObject, "tensor");
    if (rebuild_kind(inner) == RebuildKind::kNone || rebuild_kind(inner) == RebuildKind::kParameter) {
      fail("argument 0 of " + fn + ": expected a _rebuild_tensor call");
    }
    const TensorInfo* t = add_tensor(inner);
    info = *t;
    info.is_parameter = true;
    info.requires_grad = arg(1, Kind::kBool, "requires_grad").as_bool();
    info.node = &node;
  } else {
    const bool v3 = kind == RebuildKind::kTensorV3;
    const Value& pidv = arg(0, Kind::kPersistentId, "storage");
    const pickle::ValuePtr& pid = pidv.pid();
    if (!pid || !pid->is(Kind::kTuple) || pid->items().size() != 5) {
      fail("expected storage persistent id ('storage', type, key, location, numel)");
    }
    const auto& p = pid->items();
    for (std::size_t i = 0; i < 5; ++i) {
      if (!p[i]) fail("persistent id item " + std::to_string(i) + " is missing");
    }
    if (!p[0]->is(Kind::kStr) || p[0]->as_string() != "storage") fail("expected persistent id tag 'storage'");
    if (!p[1]->is(Kind::kGlobal)) fail("expected a storage type global in the persistent id");
    if (p[2]->is(Kind::kStr)) {
      info.storage_key = p[2]->as_string();
    } else if (p[2]->is(Kind::kInt)) {
      info.storage_key = std::to_string(p[2]->as_int());
    } else {
      fail("expected a str storage key in the persistent id");
    }
    if (!p[3]->is(Kind::kStr)) fail("expected a str location in the persistent id");
    info.location = p[3]->as_string();
    if (!p[4]->is(Kind::kInt) || !p[4]->int_fits_int64() || p[4]->as_int() < 0)
      fail("expected a non-negative int numel in the persistent id");
    const std::uint64_t pid_numel = static_cast<std::uint64_t>(p[4]->as_int());
    const std::string& type_name = p[1]->name();
    std::uint64_t storage_itemsize = 1;
    if (type_name == "UntypedStorage") {
      storage_itemsize = 1;
      info.dtype = DType::kUInt8;
    } else if (auto d = dtype_of_storage_type(type_name)) {
      storage_itemsize = dtype_itemsize(*d);
      info.dtype = *d;
    } else {
      fail("unsupported storage type " + p[1]->module() + "." + type_name +
           " (quantized and other special storages are not supported)");
    }
    if (v3) {
      const Value& dt = arg(6, Kind::kGlobal, "dtype");
      auto d = dtype_from_name(dt.name());
      if (dt.module() != "torch" || !d) fail("unsupported dtype " + dt.module() + "." + dt.name());
      info.dtype = *d;
    }
    const Value& off = arg(1, Kind::kInt, "storage_offset");
    if (!off.int_fits_int64() || off.as_int() < 0) fail("expected a non-negative storage_offset");
    info.storage_offset = off.as_int();
    auto int_list = [&](std::size_t i, const char* what, std::vector<std::int64_t>& out) {
      if (i >= args.size() || !args[i] || !(args[i]->is(Kind::kTuple) || args[i]->is(Kind::kList))) {
        fail(std::string("expected a tuple ") + what + " (argument " + std::to_string(i) + ")");
      }
      for (const auto& x : args[i]->items()) {
        if (!x || !x->is(Kind::kInt) || !x->int_fits_int64() || x->as_int() < 0) {
          fail(std::string("expected non-negative ints in ") + what);
        }
        out.push_back(x->as_int());
      }
    };
    int_list(2, "size", info.shape);
    int_list(3, "stride", info.strides);
    if (info.shape.size() != info.strides.size()) {
      fail("size has " + std::to_string(info.shape.size()) + " dims, stride has " +
           std::to_string(info.strides.size()));
    }
    info.requires_grad = arg(4, Kind::kBool, "requires_grad").as_bool();

    // The storage record and the bounds of the view inside it.
    std::uint64_t storage_nbytes;
    if (!mul_ok(pid_numel, storage_itemsize, storage_nbytes))
      fail("storage numel " + std::to_string(pid_numel) + " overflows");
    const ZipEntry* rec = record("data/" + info.storage_key);
    if (!rec)
      fail("storage \"" + info.storage_key + "\": record \"" + archive_name_ + "/data/" + info.storage_key +
           "\" is missing");
    ByteRange range = archive_->data_range(*rec);
    if (range.size < storage_nbytes) {
      fail("storage \"" + info.storage_key + "\": expected " + std::to_string(storage_nbytes) + " bytes (" +
           std::to_string(pid_numel) + " x " + type_name + "), record \"" + rec->name + "\" has " +
           std::to_string(range.size));
    }
    range.size = storage_nbytes;
    info.storage = range;
    const std::uint64_t itemsize = dtype_itemsize(info.dtype);
    info.storage_numel = storage_nbytes / itemsize;
    std::uint64_t numel = 1;
    bool empty = false;
    for (std::int64_t s : info.shape) {
      if (s == 0) empty = true;
      if (!mul_ok(numel, static_cast<std::uint64_t>(s), numel)) fail("shape overflows");
    }
    if (!mul_ok(numel, itemsize, storage_nbytes)) fail("tensor byte size overflows");
    if (!empty) {
      unsigned __int128 extent = 1;
      for (std::size_t i = 0; i < info.shape.size(); ++i) {
        extent += static_cast<unsigned __int128>(info.shape[i] - 1) * static_cast<std::uint64_t>(info.strides[i]);
      }
      extent += static_cast<std::uint64_t>(info.storage_offset);
      if (extent > info.storage_numel) {
        fail("storage \"" + info.storage_key + "\": view (offset " + std::to_string(info.storage_offset) +
             ") reaches element " +
             std::to_string(static_cast<std::uint64_t>(std::min<unsigned __int128>(extent, UINT64_MAX))) +
             " of a storage of " + std::to_string(info.storage_numel) + " " + std::string(dtype_name(info.dtype)) +
             " elements");
      }
    }
    info.big_endian = big_endian_;
    info.node = &node;
    storages_.emplace(info.storage_key, ByteRange{range.offset, archive_->data_range(*rec).size});
  }
  by_node_.emplace(&node, tensors_.size());
  tensors_.push_back(std::move(info));
  return &tensors_.back();
}

const TensorInfo* TorchFile::tensor_of(const pickle::Value& node) const {
  auto it = by_node_.find(&node);
  return it == by_node_.end() ? nullptr : &tensors_[it->second];
}

std::optional<ByteSpan> TorchFile::storage_view(const TensorInfo& info) const {
  return source_->view(info.storage.offset, info.storage.size, "storage \"" + info.storage_key + "\"");
}

void TorchFile::read_tensor(const TensorInfo& info, std::span<std::byte> out) const {
  if (out.size() != info.nbytes()) {
    throw UsageError("read_tensor: buffer of " + std::to_string(out.size()) + " bytes for a tensor of " +
                     std::to_string(info.nbytes()));
  }
  std::size_t pos = 0;
  const std::string what = "storage \"" + info.storage_key + "\"";
  for_each_run(info, [&](std::uint64_t offset, std::uint64_t n) {
    source_->read(offset, out.subspan(pos, static_cast<std::size_t>(n)), what);
    pos += static_cast<std::size_t>(n);
  });
  if (info.big_endian) {
    std::size_t width = dtype_itemsize(info.dtype);
    if (info.dtype == DType::kComplex32 || info.dtype == DType::kComplex64 || info.dtype == DType::kComplex128)
      width /= 2;
    byteswap_elements(out, width);
  }
}

void for_each_run(const TensorInfo& info, const std::function<void(std::uint64_t, std::uint64_t)>& fn) {
  const std::uint64_t itemsize = dtype_itemsize(info.dtype);
  struct Dim {
    std::uint64_t size, stride;
  };
  std::vector<Dim> dims;
  for (std::size_t i = 0; i < info.shape.size(); ++i) {
    if (info.shape[i] == 0) return;
    if (info.shape[i] != 1)
      dims.push_back({static_cast<std::uint64_t>(info.shape[i]), static_cast<std::uint64_t>(info.strides[i])});
  }
  const std::uint64_t base = info.storage.offset + static_cast<std::uint64_t>(info.storage_offset) * itemsize;
  // Inner dims laid out contiguously form one run.
  std::uint64_t run_elems = 1;
  std::size_t k = dims.size();
  while (k > 0 && dims[k - 1].stride == run_elems) {
    run_elems *= dims[k - 1].size;
    --k;
  }
  const std::uint64_t run_bytes = run_elems * itemsize;
  if (k == 0) {
    fn(base, run_bytes);
    return;
  }
  std::vector<std::uint64_t> idx(k, 0);
  std::uint64_t off = base;
  std::uint64_t pending_off = base, pending_len = 0;
  while (true) {
    if (pending_len != 0 && pending_off + pending_len == off) {
      pending_len += run_bytes;
    } else {
      if (pending_len != 0) fn(pending_off, pending_len);
      pending_off = off;
      pending_len = run_bytes;
    }
    std::size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < dims[d].size) {
        off += dims[d].stride * itemsize;
        break;
      }
      off -= (dims[d].size - 1) * dims[d].stride * itemsize;
      idx[d] = 0;
      if (d == 0) {
        fn(pending_off, pending_len);
        return;
      }
    }
  }
}

}  // namespace shardpoint::torchfile
