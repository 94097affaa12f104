#include "format/metadata_codec.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "format/checkpoint_path.h"
#include "pickle/reader.h"
#include "pickle/repr.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

using pickle::CallKind;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Module paths written by encode_metadata (docs/dcp-format.md §3.7). Readers of every 2.x release have them.
constexpr std::string_view kDcpMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr std::string_view kDcpFilesystemModule = "torch.distributed.checkpoint.filesystem";
constexpr std::string_view kShardedTensorModule = "torch.distributed._shard.sharded_tensor.metadata";

// Names of the memory-format enum members (value = position).
constexpr std::array<std::string_view, 3> kMemFormatNames = {
    "TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"};

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string shape_text(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

bool has_negative(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](std::int64_t x) { return x < 0; });
}

// The class a kObject instantiates: NEWOBJ(cls, ...) or, defensively, the
// copyreg.__newobj__ / copyreg._reconstructor REDUCE forms of protocols 0-1.
const Value* class_of(const Value& v) {
  if (!v.is(Kind::kObject) || !v.callable()) return nullptr;
  const Value& callable = *v.callable();
  if (!callable.is(Kind::kGlobal)) return nullptr;
  if (v.call_kind() != CallKind::kReduce) return &callable;
  if (callable.module() == "copyreg" &&
      (callable.name() == "__newobj__" || callable.name() == "__newobj_ex__" ||
       callable.name() == "_reconstructor")) {
    const ValuePtr& args = v.args();
    if (args && args->is(Kind::kTuple) && !args->items().empty() && args->items()[0] &&
        args->items()[0]->is(Kind::kGlobal)) {
      return args->items()[0].get();
    }
  }
  return nullptr;
}

// The global a REDUCE calls (torch.Size, _get_layout, enum classes, pathlib...).
const Value* reduce_callable(const Value& v) {
  if (!v.is(Kind::kObject) || v.call_kind() != CallKind::kReduce || !v.callable()) return nullptr;
  return v.callable()->is(Kind::kGlobal) ? v.callable().get() : nullptr;
}

const std::vector<ValuePtr>* reduce_args(const Value& v) {
  const ValuePtr& args = v.args();
  if (!args || !args->is(Kind::kTuple)) return nullptr;
  return &args->items();
}

// Short description of what was found, for "expected X, found Y".
std::string describe(const Value* v) {
  if (v == nullptr) return "nothing";
  switch (v->kind()) {
    case Kind::kNone: return "None";
    case Kind::kBool: return std::string("builtins.bool ") + (v->as_bool() ? "True" : "False");
    case Kind::kInt:
      return v->int_fits_int64() ? "builtins.int " + std::to_string(v->as_int())
                                 : std::string("builtins.int (wider than 64 bits)");
    case Kind::kStr: {
      std::string s = v->as_string();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return "builtins.str " + quote(s);
    }
    case Kind::kGlobal: return "global " + v->module() + "." + v->name();
    case Kind::kObject: {
      if (const Value* cls = class_of(*v)) return cls->module() + "." + cls->name() + " object";
      if (const Value* fn = reduce_callable(*v)) return "call of " + fn->module() + "." + fn->name();
      return "object";
    }
    case Kind::kPersistentId: return "persistent id";
    default: return "builtins." + std::string(pickle::kind_name(v->kind()));
  }
}

// The BUILD state of a dataclass instance: a dict, or (dict, slots-dict) as Python writes
// for objects with __slots__. Missing state = no fields.
class Fields {
 public:
  Fields() = default;
  explicit Fields(const Value* primary, const Value* secondary = nullptr)
      : primary_(primary), secondary_(secondary) {}
  const Value* get(std::string_view key) const {
    for (const Value* d : {primary_, secondary_}) {
      if (d == nullptr) continue;
      // Last occurrence wins, as in a Python dict filled by SETITEMS.
      const Value* found = nullptr;
      for (const auto& [k, val] : d->entries()) {
        if (k && k->is(Kind::kStr) && k->as_string() == key) found = val.get();
      }
      if (found != nullptr) return found;
    }
    return nullptr;
  }

 private:
  const Value* primary_ = nullptr;
  const Value* secondary_ = nullptr;
};

class Decoder {
 public:
  explicit Decoder(std::string_view source) : source_(source) {}

  Metadata decode(const Value& root) {
    Metadata md;
    expect_class(root, "Metadata", "Metadata", "the pickle's root");
    Fields f = fields(root, "Metadata");

    const Value* sdm = f.get("state_dict_metadata");
    if (sdm == nullptr) fail("Metadata.state_dict_metadata", "a dict", nullptr);
    if (!sdm->is(Kind::kDict)) fail("Metadata.state_dict_metadata", "a dict", sdm);
    for (const auto& [k, v] : sdm->entries()) {
      if (!k || !k->is(Kind::kStr)) fail("state_dict_metadata key", "a str", k.get());
      const std::string& fqn = k->as_string();
      if (!v) fail("state_dict_metadata[" + quote(fqn) + "]", "TensorStorageMetadata or BytesStorageMetadata", nullptr);
      if (md.state_dict_metadata.insert_or_assign(fqn, storage_metadata(*v, fqn)).second) md.key_order.push_back(fqn);
    }

    if (const Value* pd = f.get("planner_data"); pd != nullptr && !pd->is_none()) {
      md.planner_data_raw = find_ptr(root, "planner_data");
      if (pd->is(Kind::kDict)) {
        for (const auto& [k, v] : pd->entries()) {
          if (!k || !k->is(Kind::kStr) || !v) continue;
          if (std::optional<ObjectPath> path = object_path(*v)) {
            md.planner_data.insert_or_assign(k->as_string(), std::move(*path));
          }
        }
      }
    }

    if (const Value* sd = f.get("storage_data"); sd != nullptr && !sd->is_none()) {
      if (!sd->is(Kind::kDict)) fail("Metadata.storage_data", "a dict", sd);
      for (const auto& [k, v] : sd->entries()) {
        MetadataIndex index = metadata_index(k.get());
        std::string where = "storage_data[" + index_text(index) + "]";
        StorageInfo info = storage_info(v.get(), where);
        md.storage_data.insert_or_assign(std::move(index), std::move(info));
      }
    }

    if (const Value* sm = f.get("storage_meta"); sm != nullptr && !sm->is_none()) {
      md.storage_meta = storage_meta(*sm);
    }
    if (const Value* ver = f.get("version"); ver != nullptr && !ver->is_none()) {
      if (!ver->is(Kind::kStr)) fail("Metadata.version", "a str or None", ver);
      md.version = ver->as_string();
    }
    return md;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& expected, const Value* found) const {
    throw FormatError(std::string(source_) + ": " + where + ": expected " + expected + ", found " +
                      describe(found));
  }
  [[noreturn]] void fail_text(const std::string& where, const std::string& detail) const {
    throw FormatError(std::string(source_) + ": " + where + ": " + detail);
  }

  // The ValuePtr under `key` in root's state (to keep planner_data_raw shared, not copied).
  static ValuePtr find_ptr(const Value& root, std::string_view key) {
    const ValuePtr& state = root.state();
    if (!state) return nullptr;
    const Value* d = state.get();
    if (d->is(Kind::kTuple) && !d->items().empty() && d->items()[0]) d = d->items()[0].get();
    if (!d->is(Kind::kDict)) return nullptr;
    ValuePtr found;
    for (const auto& [k, v] : d->entries()) {
      if (k && k->is(Kind::kStr) && k->as_string() == key) found = v;
    }
    return found;
  }

  static bool class_is(const Value& v, std::string_view name) {
    const Value* cls = class_of(v);
    return cls != nullptr && cls->name() == name && cls->module().starts_with("torch.");
  }

  void expect_class(const Value& v, std::string_view name, const std::string& expected,
                    const std::string& where) const {
    if (!class_is(v, name)) fail(where, expected, &v);
  }

  // Dict state of a dataclass instance; `where` names it in errors.
  Fields fields(const Value& obj, const std::string& where) const {
    const ValuePtr& state = obj.state();
    if (!state || state->is_none()) return Fields();
    if (state->is(Kind::kDict)) return Fields(state.get());
    if (state->is(Kind::kTuple) && state->items().size() == 2) {
      const Value* a = state->items()[0].get();
      const Value* b = state->items()[1].get();
      auto dict_or_none = [](const Value* x) { return x && (x->is(Kind::kDict) || x->is_none()); };
      if (dict_or_none(a) && dict_or_none(b)) {
        return Fields(a->is(Kind::kDict) ? a : nullptr, b->is(Kind::kDict) ? b : nullptr);
      }
    }
    fail(where + " state", "a dict", state.get());
  }

  const Value& required(const Fields& f, std::string_view key, const std::string& where) const {
    const Value* v = f.get(key);
    if (v == nullptr) fail_text(where, "missing field '" + std::string(key) + "'");
    return *v;
  }

  std::int64_t int_value(const Value* v, const std::string& where, bool non_negative) const {
    if (v == nullptr || !v->is(Kind::kInt) || !v->int_fits_int64()) {
      fail(where, non_negative ? "a non-negative int" : "an int", v);
    }
    std::int64_t x = v->as_int();
    if (non_negative && x < 0) fail(where, "a non-negative int", v);
    return x;
  }

  bool bool_value(const Value* v, const std::string& where) const {
    if (v == nullptr || !v->is(Kind::kBool)) fail(where, "a bool", v);
    return v->as_bool();
  }

  std::string str_value(const Value* v, const std::string& where) const {
    if (v == nullptr || !v->is(Kind::kStr)) fail(where, "a str", v);
    return v->as_string();
  }

  // torch.Size((...)) (REDUCE of torch.Size with a 1-tuple holding a tuple of ints); a plain
  // tuple/list of ints is accepted too.
  Shape shape(const Value* v, const std::string& where) const {
    const std::string expected = "torch.Size";
    if (v == nullptr) fail(where, expected, v);
    const Value* seq = v;
    if (const Value* fn = reduce_callable(*v)) {
      const auto* args = reduce_args(*v);
      if (!(fn->module() == "torch" && fn->name() == "Size") || args == nullptr || args->size() != 1 ||
          !(*args)[0]) {
        fail(where, expected, v);
      }
      seq = (*args)[0].get();
    }
    if (!seq->is(Kind::kTuple) && !seq->is(Kind::kList)) fail(where, expected, v);
    Shape out;
    out.reserve(seq->items().size());
    for (std::size_t i = 0; i < seq->items().size(); ++i) {
      out.push_back(int_value(seq->items()[i].get(), where + "[" + std::to_string(i) + "]", true));
    }
    return out;
  }

  StorageMetadata storage_metadata(const Value& v, const std::string& fqn) const {
    const std::string where = "state_dict_metadata[" + quote(fqn) + "]";
    if (class_is(v, "BytesStorageMetadata")) return BytesStorageMetadata{};
    if (!class_is(v, "TensorStorageMetadata")) {
      fail(where, "TensorStorageMetadata or BytesStorageMetadata", &v);
    }
    Fields f = fields(v, where);
    TensorStorageMetadata t;
    t.properties = properties(required(f, "properties", where), where + ".properties");
    t.size = shape(&required(f, "size", where), where + ".size");
    const Value& chunks = required(f, "chunks", where);
    if (!chunks.is(Kind::kList) && !chunks.is(Kind::kTuple)) fail(where + ".chunks", "a list", &chunks);
    t.chunks.reserve(chunks.items().size());
    for (std::size_t i = 0; i < chunks.items().size(); ++i) {
      const std::string cw = where + ".chunks[" + std::to_string(i) + "]";
      const Value* c = chunks.items()[i].get();
      if (c == nullptr || !class_is(*c, "ChunkStorageMetadata")) fail(cw, "ChunkStorageMetadata", c);
      Fields cf = fields(*c, cw);
      ChunkStorageMetadata chunk;
      chunk.offsets = shape(&required(cf, "offsets", cw), cw + ".offsets");
      chunk.sizes = shape(&required(cf, "sizes", cw), cw + ".sizes");
      if (chunk.offsets.size() != t.size.size() || chunk.sizes.size() != t.size.size()) {
        fail_text(cw, "expected offsets and sizes of rank " + std::to_string(t.size.size()) +
                          " (the tensor's size " + shape_text(t.size) + "), found offsets " +
                          shape_text(chunk.offsets) + " and sizes " + shape_text(chunk.sizes));
      }
      t.chunks.push_back(std::move(chunk));
    }
    return t;
  }

  TensorProperties properties(const Value& v, const std::string& where) const {
    if (!class_is(v, "TensorProperties")) fail(where, "TensorProperties", &v);
    TensorProperties p;
    const ValuePtr& state = v.state();
    if (state && state->is(Kind::kTuple)) {
      // __getstate__: (dtype, layout, requires_grad, memory_format enum, pin_memory), and
      // in newer PyTorch a sixth element, strides (None or a tuple of ints).
      const auto& items = state->items();
      if (items.size() != 5 && items.size() != 6) {
        fail(where + " state", "a 5- or 6-tuple (dtype, layout, requires_grad, memory_format, pin_memory[, strides])",
             state.get());
      }
      p.dtype = dtype(items[0].get(), where + ".dtype");
      layout(items[1].get(), where + ".layout");
      p.requires_grad = bool_value(items[2].get(), where + ".requires_grad");
      p.memory_format = memory_format(items[3].get(), where + ".memory_format");
      p.pin_memory = bool_value(items[4].get(), where + ".pin_memory");
      if (items.size() == 6 && items[5] && !items[5]->is(Kind::kNone)) {
        p.strides = shape(items[5].get(), where + ".strides");
      }
      return p;
    }
    if (state && state->is(Kind::kDict)) {
      // Plain dataclass state (no __getstate__); not written by any release read, accepted.
      Fields f(state.get());
      p.dtype = dtype(&required(f, "dtype", where), where + ".dtype");
      if (const Value* l = f.get("layout")) layout(l, where + ".layout");
      if (const Value* r = f.get("requires_grad")) p.requires_grad = bool_value(r, where + ".requires_grad");
      if (const Value* m = f.get("memory_format")) p.memory_format = memory_format(m, where + ".memory_format");
      if (const Value* pin = f.get("pin_memory")) p.pin_memory = bool_value(pin, where + ".pin_memory");
      return p;
    }
    fail(where + " state", "a 5- or 6-tuple (dtype, layout, requires_grad, memory_format, pin_memory[, strides])",
         state.get());
  }

  DType dtype(const Value* v, const std::string& where) const {
    if (v == nullptr || !v->is(Kind::kGlobal) || v->module() != "torch") {
      fail(where, "a dtype global such as torch.float32", v);
    }
    std::optional<DType> d = dtype_from_name(v->name());
    if (!d) fail_text(where, "unsupported dtype torch." + v->name());
    return *d;
  }

  void layout(const Value* v, const std::string& where) const {
    const std::string expected = "torch.strided (_get_layout('torch.strided'))";
    if (v == nullptr) fail(where, expected, v);
    if (v->is_global("torch", "strided")) return;
    const Value* fn = reduce_callable(*v);
    const auto* args = fn ? reduce_args(*v) : nullptr;
    if (fn == nullptr || fn->name() != "_get_layout" || args == nullptr || args->size() != 1 ||
        !(*args)[0] || !(*args)[0]->is(Kind::kStr)) {
      fail(where, expected, v);
    }
    const std::string& name = (*args)[0]->as_string();
    if (name != "torch.strided") fail_text(where, "unsupported layout " + name + " (only torch.strided)");
  }

  static bool is_mem_format_enum(const Value* v) {
    return v != nullptr && v->is(Kind::kGlobal) &&
           (v->name() == "MEM_FORMAT_ENCODING" || v->name() == "_MEM_FORMAT_ENCODING");
  }

  int memory_format(const Value* v, const std::string& where) const {
    const std::string expected = "MEM_FORMAT_ENCODING(0..2) or getattr(MEM_FORMAT_ENCODING, 'TORCH_..._FORMAT')";
    if (v == nullptr) fail(where, expected, v);
    std::int64_t value = -1;
    if (v->is(Kind::kInt) && v->int_fits_int64()) {
      value = v->as_int();
    } else if (const Value* fn = reduce_callable(*v)) {
      const auto* args = reduce_args(*v);
      if (args == nullptr) fail(where, expected, v);
      if (is_mem_format_enum(fn) && args->size() == 1 && (*args)[0] && (*args)[0]->is(Kind::kInt) &&
          (*args)[0]->int_fits_int64()) {
        value = (*args)[0]->as_int();
      } else if (fn->module() == "builtins" && fn->name() == "getattr" && args->size() == 2 &&
                 is_mem_format_enum((*args)[0].get()) && (*args)[1] && (*args)[1]->is(Kind::kStr)) {
        const std::string& member = (*args)[1]->as_string();
        auto it = std::find(kMemFormatNames.begin(), kMemFormatNames.end(), member);
        if (it == kMemFormatNames.end()) fail_text(where, "unknown memory format member '" + member + "'");
        value = it - kMemFormatNames.begin();
      } else {
        fail(where, expected, v);
      }
    } else {
      fail(where, expected, v);
    }
    if (value < 0 || value > 2) fail_text(where, "memory format value " + std::to_string(value) + " is not 0, 1 or 2");
    return static_cast<int>(value);
  }

  static std::optional<ObjectPath> object_path(const Value& v) {
    if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) return std::nullopt;
    ObjectPath path;
    for (const ValuePtr& item : v.items()) {
      if (item && item->is(Kind::kStr)) {
        path.emplace_back(item->as_string());
      } else if (item && item->is(Kind::kInt) && item->int_fits_int64()) {
        path.emplace_back(item->as_int());
      } else {
        return std::nullopt;
      }
    }
    return path;
  }

  static std::string index_text(const MetadataIndex& index) {
    std::string out = "MetadataIndex(fqn=" + quote(index.fqn);
    if (index.offset) out += ", offset=" + shape_text(*index.offset);
    return out + ")";
  }

  MetadataIndex metadata_index(const Value* v) const {
    const std::string where = "storage_data key";
    if (v == nullptr || !class_is(*v, "MetadataIndex")) fail(where, "MetadataIndex", v);
    Fields f = fields(*v, where);
    MetadataIndex index;
    index.fqn = str_value(&required(f, "fqn", where), where + ".fqn");
    const std::string w = "storage_data[MetadataIndex(fqn=" + quote(index.fqn) + ")]";
    if (const Value* o = f.get("offset"); o != nullptr && !o->is_none()) index.offset = shape(o, w + ".offset");
    if (const Value* i = f.get("index"); i != nullptr && !i->is_none()) index.index = int_value(i, w + ".index", false);
    return index;
  }

  StorageInfo storage_info(const Value* v, const std::string& where) const {
    if (v == nullptr || !class_is(*v, "_StorageInfo")) fail(where, "_StorageInfo", v);
    Fields f = fields(*v, where);
    StorageInfo info;
    info.relative_path = str_value(&required(f, "relative_path", where), where + ".relative_path");
    info.offset = static_cast<std::uint64_t>(int_value(&required(f, "offset", where), where + ".offset", true));
    info.length = static_cast<std::uint64_t>(int_value(&required(f, "length", where), where + ".length", true));
    if (const Value* t = f.get("transform_descriptors"); t != nullptr && !t->is_none()) {
      if (!t->is(Kind::kList) && !t->is(Kind::kTuple)) fail(where + ".transform_descriptors", "a list of str", t);
      for (std::size_t i = 0; i < t->items().size(); ++i) {
        info.transform_descriptors.push_back(
            str_value(t->items()[i].get(), where + ".transform_descriptors[" + std::to_string(i) + "]"));
      }
    }
    return info;
  }

  // pathlib.(Pure)(Posix|Windows)Path(*parts) -> the joined path text.
  static std::optional<std::string> path_text(const Value& v) {
    const Value* fn = reduce_callable(v);
    if (fn == nullptr) fn = class_of(v);
    if (fn == nullptr || !(fn->module() == "pathlib" || fn->module().starts_with("pathlib."))) return std::nullopt;
    if (!fn->name().ends_with("Path")) return std::nullopt;
    const auto* args = reduce_args(v);
    if (args == nullptr) return std::nullopt;
    const char sep = fn->name().find("Windows") != std::string::npos ? '\\' : '/';
    std::string out;
    for (const ValuePtr& part : *args) {
      if (!part || !part->is(Kind::kStr)) return std::nullopt;
      const std::string& s = part->as_string();
      if (!out.empty() && out.back() != sep && out.back() != '/') out.push_back(sep);
      out += s;
    }
    return out;
  }

  std::optional<std::string> optional_str(const Fields& f, std::string_view key, const std::string& where) const {
    const Value* v = f.get(key);
    if (v == nullptr || v->is_none()) return std::nullopt;
    return str_value(v, where + "." + std::string(key));
  }

  StorageMeta storage_meta(const Value& v) const {
    const std::string where = "Metadata.storage_meta";
    if (!class_is(v, "StorageMeta")) fail(where, "StorageMeta or None", &v);
    Fields f = fields(v, where);
    StorageMeta sm;
    if (const Value* id = f.get("checkpoint_id"); id != nullptr && !id->is_none()) {
      if (id->is(Kind::kStr)) {
        sm.checkpoint_id = id->as_string();
      } else if (std::optional<std::string> p = path_text(*id)) {
        sm.checkpoint_id = std::move(*p);
      } else {
        // Informational only (e.g. a third-party PathLike): keep what Python would print.
        sm.checkpoint_id = pickle::repr(*id);
      }
    }
    sm.save_id = optional_str(f, "save_id", where);
    sm.load_id = optional_str(f, "load_id", where);
    if (const Value* m = f.get("modules"); m != nullptr && !m->is_none()) {
      if (!m->is(Kind::kList) && !m->is(Kind::kTuple)) fail(where + ".modules", "a list of str", m);
      for (std::size_t i = 0; i < m->items().size(); ++i) {
        sm.modules.push_back(str_value(m->items()[i].get(), where + ".modules[" + std::to_string(i) + "]"));
      }
    }
    return sm;
  }

  std::string_view source_;
};

// ---- encoding ----------------------------------------------------------------------

class Encoder {
 public:
  std::string encode(const Metadata& md) {
    validate(md);
    DictBuilder state_dict_metadata(*this);
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
        state_dict_metadata.add(fqn, tensor(*t));
      } else {
        // BUILD {} as in §3.7; PyTorch on Python >= 3.11 omits it, both load.
        state_dict_metadata.add(fqn, instance(bytes_cls_, Value::dict()));
      }
    }

    DictBuilder planner_data(*this);
    for (const auto& [fqn, path] : effective_planner_data(md)) {
      std::vector<ValuePtr> items;
      for (const PathElement& e : path) {
        if (const auto* s = std::get_if<std::string>(&e)) {
          items.push_back(text(*s));
        } else {
          items.push_back(Value::integer(std::get<std::int64_t>(e)));
        }
      }
      planner_data.add(fqn, Value::tuple(std::move(items)));
    }

    pickle::DictEntries storage_data;
    for (const auto& [index, info] : md.storage_data) {
      storage_data.emplace_back(metadata_index(md, index), storage_info(info));
    }

    DictBuilder root_state(*this);
    root_state.add("state_dict_metadata", state_dict_metadata.take());
    root_state.add("planner_data", planner_data.take());
    root_state.add("storage_data", Value::dict(std::move(storage_data)));
    ValuePtr root = instance(metadata_cls_, root_state.take());
    return pickle::pickle_to_string(*root, pickle::WriteOptions{.protocol = 2});
  }

  static std::map<std::string, ObjectPath> effective_planner_data(const Metadata& md) {
    std::map<std::string, ObjectPath> out = md.planner_data;
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      if (!out.contains(fqn)) out.emplace(fqn, ObjectPath{fqn});
    }
    return out;
  }

 private:
  // What decode_metadata would refuse (and PyTorch could not use) is a UsageError here, so
  // that every output decodes.
  static void validate(const Metadata& md) {
    auto fail = [](const std::string& where, const std::string& what) {
      throw UsageError("encode_metadata: " + where + ": " + what);
    };
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      const auto* t = std::get_if<TensorStorageMetadata>(&entry);
      if (t == nullptr) continue;
      const std::string where = "state_dict_metadata[" + quote(fqn) + "]";
      if (has_negative(t->size)) fail(where, "negative size " + shape_text(t->size));
      if (t->properties.memory_format < 0 || t->properties.memory_format > 2) {
        fail(where, "memory_format " + std::to_string(t->properties.memory_format) + " is not 0, 1 or 2");
      }
      for (std::size_t i = 0; i < t->chunks.size(); ++i) {
        const ChunkStorageMetadata& c = t->chunks[i];
        if (c.offsets.size() != t->size.size() || c.sizes.size() != t->size.size() || has_negative(c.offsets) ||
            has_negative(c.sizes)) {
          fail(where + ".chunks[" + std::to_string(i) + "]",
               "offsets " + shape_text(c.offsets) + " and sizes " + shape_text(c.sizes) +
                   " must be non-negative and of the tensor's rank " + std::to_string(t->size.size()));
        }
      }
    }
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (const auto& [index, info] : md.storage_data) {
      const std::string where = "storage_data[" + quote(index.fqn) + "]";
      if (index.offset && has_negative(*index.offset)) fail(where, "negative offset " + shape_text(*index.offset));
      if (info.offset > kMax || info.length > kMax) fail(where, "offset/length beyond 2^63-1");
    }
  }

  // One node per distinct text. The writer memoizes by node, so a repeated key, fqn or file
  // name costs a BINGET instead of another copy, as in PyTorch's own files (Python shares
  // those string objects); the file is about half the size and decodes faster.
  ValuePtr text(const std::string& s) {
    auto [it, inserted] = texts_.try_emplace(s);
    if (inserted) it->second = Value::str(s);
    return it->second;
  }

  class DictBuilder {
   public:
    explicit DictBuilder(Encoder& encoder) : encoder_(encoder) {}
    void add(const std::string& key, ValuePtr value) { entries_.emplace_back(encoder_.text(key), std::move(value)); }
    ValuePtr take() { return Value::dict(std::move(entries_)); }

   private:
    Encoder& encoder_;
    pickle::DictEntries entries_;
  };

  // cls.__new__(cls) + BUILD state, the default dataclass pickling (docs/dcp-format.md §3.3).
  static ValuePtr instance(const ValuePtr& cls, ValuePtr state) {
    ValuePtr obj = Value::object(CallKind::kNewObj, cls, Value::tuple());
    obj->set_state(std::move(state));
    return obj;
  }

  ValuePtr size(const Shape& shape) {
    std::vector<ValuePtr> dims;
    dims.reserve(shape.size());
    for (std::int64_t d : shape) dims.push_back(Value::integer(d));
    return Value::object(CallKind::kReduce, torch_size_, Value::tuple({Value::tuple(std::move(dims))}));
  }

  ValuePtr tensor(const TensorStorageMetadata& t) {
    const TensorProperties& p = t.properties;
    std::vector<ValuePtr> fields{Value::global("torch", std::string(dtype_name(p.dtype))), strided_layout_,
                                 Value::boolean(p.requires_grad), memory_format(p.memory_format),
                                 Value::boolean(p.pin_memory)};
    if (p.strides) {
      std::vector<ValuePtr> strides;
      for (std::int64_t d : *p.strides) strides.push_back(Value::integer(d));
      fields.push_back(Value::tuple(std::move(strides)));
    }
    ValuePtr props = instance(properties_cls_, Value::tuple(std::move(fields)));
    std::vector<ValuePtr> chunks;
    chunks.reserve(t.chunks.size());
    for (const ChunkStorageMetadata& c : t.chunks) {
      DictBuilder cs(*this);
      cs.add("offsets", size(c.offsets));
      cs.add("sizes", size(c.sizes));
      chunks.push_back(instance(chunk_cls_, cs.take()));
    }
    DictBuilder state(*this);
    state.add("properties", std::move(props));
    state.add("size", size(t.size));
    state.add("chunks", Value::list(std::move(chunks)));
    return instance(tensor_cls_, state.take());
  }

  // torch.strided and the MEM_FORMAT_ENCODING members are singletons in Python, pickled
  // once and then fetched from the memo; so here.
  ValuePtr memory_format(int encoding) {
    auto [it, inserted] = memory_formats_.try_emplace(encoding);
    if (inserted) it->second = Value::object(CallKind::kReduce, mem_format_, Value::tuple({Value::integer(encoding)}));
    return it->second;
  }

  ValuePtr metadata_index(const Metadata& md, const MetadataIndex& index) {
    ValuePtr hint = Value::none();
    if (index.index) {
      hint = Value::integer(*index.index);
    } else if (index.offset) {
      auto it = md.state_dict_metadata.find(index.fqn);
      if (it != md.state_dict_metadata.end()) {
        if (const auto* t = std::get_if<TensorStorageMetadata>(&it->second)) {
          for (std::size_t i = 0; i < t->chunks.size(); ++i) {
            if (t->chunks[i].offsets == *index.offset) {
              hint = Value::integer(static_cast<std::int64_t>(i));
              break;
            }
          }
        }
      }
    }
    // Field order of MetadataIndex.__init__: fqn, index, then offset only when not None.
    DictBuilder state(*this);
    state.add("fqn", text(index.fqn));
    state.add("index", std::move(hint));
    if (index.offset) state.add("offset", size(*index.offset));
    return instance(index_cls_, state.take());
  }

  ValuePtr storage_info(const StorageInfo& info) {
    DictBuilder state(*this);
    state.add("relative_path", text(info.relative_path));
    state.add("offset", Value::integer(static_cast<std::int64_t>(info.offset)));
    state.add("length", Value::integer(static_cast<std::int64_t>(info.length)));
    if (!info.transform_descriptors.empty()) {
      std::vector<ValuePtr> items;
      for (const std::string& d : info.transform_descriptors) items.push_back(text(d));
      state.add("transform_descriptors", Value::list(std::move(items)));
    }
    return instance(storage_info_cls_, state.take());
  }

  // Shared global nodes: the writer emits each once and refers to it through the memo.
  ValuePtr metadata_cls_ = Value::global(std::string(kDcpMetadataModule), "Metadata");
  ValuePtr tensor_cls_ = Value::global(std::string(kDcpMetadataModule), "TensorStorageMetadata");
  ValuePtr bytes_cls_ = Value::global(std::string(kDcpMetadataModule), "BytesStorageMetadata");
  ValuePtr chunk_cls_ = Value::global(std::string(kDcpMetadataModule), "ChunkStorageMetadata");
  ValuePtr index_cls_ = Value::global(std::string(kDcpMetadataModule), "MetadataIndex");
  ValuePtr storage_info_cls_ = Value::global(std::string(kDcpFilesystemModule), "_StorageInfo");
  ValuePtr properties_cls_ = Value::global(std::string(kShardedTensorModule), "TensorProperties");
  ValuePtr mem_format_ = Value::global(std::string(kShardedTensorModule), "MEM_FORMAT_ENCODING");
  ValuePtr torch_size_ = Value::global("torch", "Size");
  ValuePtr get_layout_ = Value::global("torch.serialization", "_get_layout");
  ValuePtr strided_layout_ = Value::object(CallKind::kReduce, get_layout_, Value::tuple({Value::str("torch.strided")}));
  std::map<int, ValuePtr> memory_formats_;
  std::unordered_map<std::string, ValuePtr> texts_;
};

// ---- tiling ------------------------------------------------------------------------

std::optional<std::uint64_t> checked_volume(const Shape& sizes) {
  std::uint64_t v = 1;
  for (std::int64_t d : sizes) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(v, static_cast<std::uint64_t>(d), &v)) return std::nullopt;
  }
  return v;
}

}  // namespace

Metadata decode_metadata(ByteSpan bytes, std::string_view source_name) {
  ValuePtr root = pickle::read_pickle(bytes, source_name);
  if (!root) throw FormatError(std::string(source_name) + ": empty pickle");
  Metadata md = Decoder(source_name).decode(*root);
  return md;
}

std::string encode_metadata(const Metadata& metadata) { return Encoder().encode(metadata); }

std::string describe_chunk(const ChunkStorageMetadata& chunk) {
  std::string out = "[";
  const std::size_t n = std::max(chunk.offsets.size(), chunk.sizes.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (i >= chunk.offsets.size() || i >= chunk.sizes.size()) {
      out += "?";
      continue;
    }
    std::int64_t o = chunk.offsets[i], s = chunk.sizes[i], end = 0;
    out += std::to_string(o) + ":";
    out += __builtin_add_overflow(o, s, &end) ? std::to_string(o) + "+" + std::to_string(s) : std::to_string(end);
  }
  return out + "]";
}

std::vector<std::string> check_chunk_tiling(const TensorStorageMetadata& tensor) {
  constexpr std::size_t kMaxOverlapReports = 20;
  std::vector<std::string> problems;
  const Shape& size = tensor.size;
  const std::size_t rank = size.size();
  if (has_negative(size)) {
    problems.push_back("tensor size " + shape_text(size) + " has a negative dimension");
    return problems;
  }
  std::optional<std::uint64_t> total = checked_volume(size);
  if (!total) problems.push_back("tensor size " + shape_text(size) + ": element count does not fit in 64 bits");

  std::vector<std::size_t> valid;
  for (std::size_t i = 0; i < tensor.chunks.size(); ++i) {
    const ChunkStorageMetadata& c = tensor.chunks[i];
    const std::string name = "chunk " + std::to_string(i) + " " + describe_chunk(c);
    if (c.offsets.size() != rank || c.sizes.size() != rank) {
      problems.push_back(name + " has rank " + std::to_string(c.offsets.size()) + "/" +
                         std::to_string(c.sizes.size()) + " (offsets/sizes), the tensor has rank " +
                         std::to_string(rank));
      continue;
    }
    if (has_negative(c.offsets) || has_negative(c.sizes)) {
      problems.push_back(name + " has a negative offset or size");
      continue;
    }
    bool inside = true;
    for (std::size_t d = 0; d < rank; ++d) {
      // offsets + sizes <= size, without overflowing.
      if (c.offsets[d] > size[d] || c.sizes[d] > size[d] - c.offsets[d]) inside = false;
    }
    if (!inside) {
      problems.push_back(name + " lies outside the tensor of size " + shape_text(size));
      continue;
    }
    valid.push_back(i);
  }

  // Overlaps: strict box intersection. Sweep along the dimension with the most distinct
  // offsets so that typical shardings compare few pairs.
  std::size_t sweep_dim = 0;
  if (rank > 0) {
    std::size_t best = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::set<std::int64_t> distinct;
      for (std::size_t i : valid) distinct.insert(tensor.chunks[i].offsets[d]);
      if (distinct.size() > best) {
        best = distinct.size();
        sweep_dim = d;
      }
    }
  }
  auto is_empty = [&](std::size_t i) {
    const Shape& s = tensor.chunks[i].sizes;
    return std::any_of(s.begin(), s.end(), [](std::int64_t x) { return x == 0; });
  };
  std::vector<std::size_t> order;
  for (std::size_t i : valid) {
    if (!is_empty(i)) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return rank > 0 && tensor.chunks[a].offsets[sweep_dim] < tensor.chunks[b].offsets[sweep_dim];
  });
  std::size_t overlaps = 0;
  for (std::size_t x = 0; x < order.size(); ++x) {
    const ChunkStorageMetadata& a = tensor.chunks[order[x]];
    for (std::size_t y = x + 1; y < order.size(); ++y) {
      const ChunkStorageMetadata& b = tensor.chunks[order[y]];
      // In bounds, so offset + size cannot overflow.
      if (rank > 0 && b.offsets[sweep_dim] >= a.offsets[sweep_dim] + a.sizes[sweep_dim]) break;
      bool overlap = true;
      for (std::size_t d = 0; d < rank && overlap; ++d) {
        overlap = a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d];
      }
      if (!overlap) continue;
      if (++overlaps <= kMaxOverlapReports) {
        std::size_t first = std::min(order[x], order[y]), second = std::max(order[x], order[y]);
        problems.push_back("chunk " + std::to_string(second) + " " + describe_chunk(tensor.chunks[second]) +
                           " overlaps chunk " + std::to_string(first) + " " +
                           describe_chunk(tensor.chunks[first]));
      }
    }
  }
  if (overlaps > kMaxOverlapReports) {
    problems.push_back("... and " + std::to_string(overlaps - kMaxOverlapReports) + " more overlapping pairs");
  }

  // Coverage: with no overlaps, the chunks tile the tensor iff their volumes sum to its.
  if (overlaps == 0 && total) {
    std::uint64_t covered = 0;
    bool overflow = false;
    for (std::size_t i : valid) {
      std::optional<std::uint64_t> v = checked_volume(tensor.chunks[i].sizes);
      if (!v || __builtin_add_overflow(covered, *v, &covered)) overflow = true;
    }
    if (overflow) {
      problems.push_back("chunk volumes do not fit in 64 bits");
    } else if (covered != *total) {
      problems.push_back("chunks cover " + std::to_string(covered) + " of " + std::to_string(*total) +
                         " elements (gaps)");
    }
  }
  return problems;
}

std::vector<std::string> check_metadata(const Metadata& md) {
  std::vector<std::string> problems;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      for (const std::string& p : check_chunk_tiling(*t)) problems.push_back(quote(fqn) + ": " + p);
      for (std::size_t i = 0; i < t->chunks.size(); ++i) {
        if (!md.storage_data.contains(MetadataIndex{fqn, t->chunks[i].offsets, std::nullopt})) {
          problems.push_back(quote(fqn) + ": chunk " + std::to_string(i) + " " + describe_chunk(t->chunks[i]) +
                             " has no storage_data entry");
        }
      }
    } else if (!md.storage_data.contains(MetadataIndex{fqn, std::nullopt, std::nullopt})) {
      problems.push_back(quote(fqn) + ": bytes item has no storage_data entry");
    }
  }
  // file -> (offset, length, fqn), to find items sharing bytes.
  std::map<std::string, std::vector<std::tuple<std::uint64_t, std::uint64_t, std::string>>> by_file;
  for (const auto& [index, info] : md.storage_data) {
    const std::string key = "storage_data[" + quote(index.fqn) +
                            (index.offset ? " at " + shape_text(*index.offset) : std::string()) + "]";
    auto it = md.state_dict_metadata.find(index.fqn);
    if (it == md.state_dict_metadata.end()) {
      problems.push_back(key + " names no item of state_dict_metadata");
    } else if (const auto* t = std::get_if<TensorStorageMetadata>(&it->second)) {
      const std::optional<Shape>& offset = index.offset;
      bool found = offset && std::any_of(t->chunks.begin(), t->chunks.end(),
                                         [&](const ChunkStorageMetadata& c) { return c.offsets == *offset; });
      if (!found) problems.push_back(key + " matches no chunk of the tensor");
    } else if (index.offset) {
      problems.push_back(key + " has an offset, but the item is a bytes item");
    }
    if (!is_safe_relative_path(info.relative_path)) {
      problems.push_back(key + ": relative_path '" + info.relative_path + "' is not a plain relative path");
    }
    by_file[info.relative_path].emplace_back(info.offset, info.length, key);
  }
  for (auto& [file, items] : by_file) {
    std::sort(items.begin(), items.end());
    for (std::size_t i = 1; i < items.size(); ++i) {
      const auto& [prev_off, prev_len, prev_key] = items[i - 1];
      const auto& [off, len, key] = items[i];
      std::uint64_t prev_end = 0;
      const bool overflow = __builtin_add_overflow(prev_off, prev_len, &prev_end);
      if ((overflow || off < prev_end) && len > 0 && prev_len > 0) {
        problems.push_back(key + " [" + std::to_string(off) + "+" + std::to_string(len) + "] overlaps " + prev_key +
                           " [" + std::to_string(prev_off) + "+" + std::to_string(prev_len) + "] in '" + file + "'");
      }
    }
  }
  return problems;
}

bool same_encoded_content(const Metadata& a, const Metadata& b) {
  return a.state_dict_metadata == b.state_dict_metadata && a.storage_data == b.storage_data &&
         Encoder::effective_planner_data(a) == Encoder::effective_planner_data(b);
}

}  // namespace shardpoint::format
