// decode_metadata() (metadata_codec.h): the `.metadata` pickle of any PyTorch release
// 1.13 ... newest into format::Metadata. Classes are recognised by name, fields checked
// by kind; nothing in the pickle is executed.
#include "format/metadata_codec.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "format/metadata_codec_text.h"
#include "pickle/reader.h"
#include "pickle/repr.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

using codec_text::quote;
using codec_text::shape_text;
using pickle::CallKind;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Names of the memory-format enum members (value = position).
constexpr std::array<std::string_view, 3> kMemFormatNames = {"TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST",
                                                             "TORCH_PRESERVE_FORMAT"};

// The class a kObject instantiates: NEWOBJ(cls, ...) or, defensively, the
// copyreg.__newobj__ / copyreg._reconstructor REDUCE forms of protocols 0-1.
const Value* class_of(const Value& v) {
  if (!v.is(Kind::kObject) || !v.callable()) return nullptr;
  const Value& callable = *v.callable();
  if (!callable.is(Kind::kGlobal)) return nullptr;
  if (v.call_kind() != CallKind::kReduce) return &callable;
  if (callable.module() == "copyreg" &&
      (callable.name() == "__newobj__" || callable.name() == "__newobj_ex__" || callable.name() == "_reconstructor")) {
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
  explicit Fields(const Value* primary, const Value* secondary = nullptr) : primary_(primary), secondary_(secondary) {}
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
    throw FormatError(std::string(source_) + ": " + where + ": expected " + expected + ", found " + describe(found));
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
      if (!(fn->module() == "torch" && fn->name() == "Size") || args == nullptr || args->size() != 1 || !(*args)[0]) {
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
        fail_text(cw, "expected offsets and sizes of rank " + std::to_string(t.size.size()) + " (the tensor's size " +
                          shape_text(t.size) + "), found offsets " + shape_text(chunk.offsets) + " and sizes " +
                          shape_text(chunk.sizes));
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
    if (fn == nullptr || fn->name() != "_get_layout" || args == nullptr || args->size() != 1 || !(*args)[0] ||
        !(*args)[0]->is(Kind::kStr)) {
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

}  // namespace

Metadata decode_metadata(ByteSpan bytes, std::string_view source_name) {
  ValuePtr root = pickle::read_pickle(bytes, source_name);
  if (!root) throw FormatError(std::string(source_name) + ": empty pickle");
  Metadata md = Decoder(source_name).decode(*root);
  return md;
}

}  // namespace shardpoint::format
