#include "format/metadata_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "format/sample_metadata.h"
#include "pickle/reader.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

using pickle::CallKind;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using testing::expect_sample;
using testing::sample_metadata;

// ---- hand-built pickles of each PyTorch release's form --------------------------------

// How one PyTorch release (and Python version) pickles Metadata (docs/dcp-format.md §3.2-§3.5).
struct Form {
  std::string name;
  std::string meta_module = "torch.distributed.checkpoint.metadata";
  std::string fs_module = "torch.distributed.checkpoint.filesystem";
  std::string props_module = "torch.distributed._shard.sharded_tensor.metadata";
  std::string enum_name = "MEM_FORMAT_ENCODING";
  bool enum_getattr = true;  // Python >= 3.11: getattr(Enum, 'TORCH_CONTIGUOUS_FORMAT')
  bool bytes_build = false;  // BytesStorageMetadata with BUILD {} (Python <= 3.10)
  bool planner_data = true;  // 1.13: None
  enum class Id { kAbsent, kStr, kPosix, kLocalPosix, kWindows, kNone } checkpoint_id = Id::kAbsent;
  bool modules = false;
  bool transforms = false;
  bool version = false;
};

std::vector<Form> all_forms() {
  std::vector<Form> forms;
  Form f113{.name = "1.13"};
  f113.meta_module = "torch.distributed._shard.checkpoint.metadata";
  f113.fs_module = "torch.distributed._shard.checkpoint.filesystem";
  f113.planner_data = false;
  forms.push_back(f113);
  Form f20{.name = "2.0_py310"};
  f20.enum_getattr = false;
  f20.bytes_build = true;
  forms.push_back(f20);
  Form f23{.name = "2.3"};
  f23.props_module = f23.meta_module;
  f23.enum_name = "_MEM_FORMAT_ENCODING";
  forms.push_back(f23);
  Form f23b = f23;
  f23b.name = "2.3_unprefixed_enum";
  f23b.enum_name = "MEM_FORMAT_ENCODING";
  f23b.enum_getattr = false;
  forms.push_back(f23b);
  Form f24 = f23;
  f24.name = "2.4";
  f24.checkpoint_id = Form::Id::kPosix;
  forms.push_back(f24);
  Form f24s = f24;
  f24s.name = "2.4_str_id";
  f24s.checkpoint_id = Form::Id::kStr;
  forms.push_back(f24s);
  Form f24n = f24;
  f24n.name = "2.4_none_id";
  f24n.checkpoint_id = Form::Id::kNone;
  forms.push_back(f24n);
  Form f24w = f24;
  f24w.name = "2.4_windows";
  f24w.checkpoint_id = Form::Id::kWindows;
  forms.push_back(f24w);
  Form f27 = f24;
  f27.name = "2.7";
  f27.modules = true;
  f27.transforms = true;
  forms.push_back(f27);
  Form f29 = f27;
  f29.name = "2.9";
  f29.version = true;
  forms.push_back(f29);
  Form f313 = f29;
  f313.name = "2.9_py313";
  f313.checkpoint_id = Form::Id::kLocalPosix;
  forms.push_back(f313);
  return forms;
}

ValuePtr str(const std::string& s) { return Value::str(s); }

ValuePtr dict(std::vector<std::pair<std::string, ValuePtr>> kv) {
  pickle::DictEntries e;
  for (auto& [k, v] : kv) e.emplace_back(Value::str(k), std::move(v));
  return Value::dict(std::move(e));
}

class FormBuilder {
 public:
  explicit FormBuilder(const Form& f) : f_(f) {}

  ValuePtr build() {
    pickle::DictEntries sdm;
    sdm.emplace_back(str("model.w"), tensor("float32", false, {4, 6}, {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}}));
    sdm.emplace_back(str("model.b"), tensor("bfloat16", true, {6}, {{{0}, {6}}}));
    sdm.emplace_back(str("s"), tensor("int64", false, {}, {{{}, {}}}));
    ValuePtr bytes = newobj(f_.meta_module, "BytesStorageMetadata");
    if (f_.bytes_build) bytes->set_state(Value::dict());
    sdm.emplace_back(str("step"), bytes);

    ValuePtr planner = Value::none();
    if (f_.planner_data) {
      planner = dict({{"model.w", Value::tuple({str("model"), str("w")})},
                      {"model.b", Value::tuple({str("model"), str("b")})},
                      {"s", Value::tuple({str("s")})},
                      {"step", Value::tuple({str("step")})},
                      {"opt.0.lr", Value::tuple({str("opt"), Value::integer(0), str("lr")})}});
    }
    pickle::DictEntries sd;
    sd.emplace_back(index("model.w", Shape{0, 0}, 0), info("__0_0.distcp", 0, 700, f_.transforms));
    sd.emplace_back(index("model.w", Shape{2, 0}, 1), info("__1_0.distcp", 0, 700, false));
    sd.emplace_back(index("model.b", Shape{0}, 0), info("__0_0.distcp", 700, 747, false));
    sd.emplace_back(index("s", Shape{}, 0), info("__0_0.distcp", 1447, 747, false));
    sd.emplace_back(index("step", std::nullopt, -1), info("__0_0.distcp", 2194, 431, false));

    std::vector<std::pair<std::string, ValuePtr>> state = {{"state_dict_metadata", Value::dict(std::move(sdm))},
                                                           {"planner_data", planner},
                                                           {"storage_data", Value::dict(std::move(sd))}};
    if (f_.checkpoint_id != Form::Id::kAbsent) {
      ValuePtr id;
      switch (f_.checkpoint_id) {
        case Form::Id::kStr: id = str("/tmp/ckpt"); break;
        case Form::Id::kPosix: id = Value::call("pathlib", "PosixPath", {str("/"), str("tmp"), str("ckpt")}); break;
        case Form::Id::kLocalPosix:
          id = Value::call("pathlib._local", "PosixPath", {str("/"), str("tmp"), str("ckpt")});
          break;
        case Form::Id::kWindows:
          id = Value::call("pathlib", "WindowsPath", {str("C:\\"), str("tmp"), str("ckpt")});
          break;
        default: id = Value::none(); break;
      }
      std::vector<std::pair<std::string, ValuePtr>> sm = {
          {"checkpoint_id", id}, {"save_id", str("3f2c6a1e-save")}, {"load_id", Value::none()}};
      if (f_.modules) sm.emplace_back("modules", Value::list({str("model"), str("opt")}));
      ValuePtr meta = newobj(f_.meta_module, "StorageMeta");
      meta->set_state(dict(std::move(sm)));
      state.emplace_back("storage_meta", meta);
    }
    if (f_.version) state.emplace_back("version", str("1.0.0"));
    state.emplace_back("extra_attribute", dict({{"ignored", Value::integer(1)}}));
    ValuePtr root = newobj(f_.meta_module, "Metadata");
    root->set_state(dict(std::move(state)));
    return root;
  }

 private:
  // One node per global, shared as Python's memo would share it.
  ValuePtr global(const std::string& module, const std::string& name) {
    auto& slot = globals_[module + "." + name];
    if (!slot) slot = Value::global(module, name);
    return slot;
  }
  ValuePtr newobj(const std::string& module, const std::string& name) {
    return Value::object(CallKind::kNewObj, global(module, name), Value::tuple());
  }
  ValuePtr size(const Shape& s) {
    std::vector<ValuePtr> dims;
    for (auto d : s) dims.push_back(Value::integer(d));
    return Value::object(CallKind::kReduce, global("torch", "Size"), Value::tuple({Value::tuple(dims)}));
  }
  ValuePtr tensor(const std::string& dtype, bool requires_grad, const Shape& shape,
                  const std::vector<std::pair<Shape, Shape>>& chunks) {
    ValuePtr layout = Value::object(CallKind::kReduce, global("torch.serialization", "_get_layout"),
                                    Value::tuple({str("torch.strided")}));
    ValuePtr enum_cls = global(f_.props_module, f_.enum_name);
    ValuePtr fmt = f_.enum_getattr ? Value::object(CallKind::kReduce, global("builtins", "getattr"),
                                                   Value::tuple({enum_cls, str("TORCH_CONTIGUOUS_FORMAT")}))
                                   : Value::object(CallKind::kReduce, enum_cls, Value::tuple({Value::integer(0)}));
    ValuePtr props = newobj(f_.props_module, "TensorProperties");
    props->set_state(
        Value::tuple({global("torch", dtype), layout, Value::boolean(requires_grad), fmt, Value::boolean(false)}));
    std::vector<ValuePtr> cs;
    for (const auto& [off, sz] : chunks) {
      ValuePtr c = newobj(f_.meta_module, "ChunkStorageMetadata");
      c->set_state(dict({{"offsets", size(off)}, {"sizes", size(sz)}}));
      cs.push_back(c);
    }
    ValuePtr t = newobj(f_.meta_module, "TensorStorageMetadata");
    t->set_state(dict({{"properties", props}, {"size", size(shape)}, {"chunks", Value::list(cs)}}));
    return t;
  }
  ValuePtr index(const std::string& fqn, std::optional<Shape> offset, std::int64_t idx) {
    std::vector<std::pair<std::string, ValuePtr>> kv = {{"fqn", str(fqn)},
                                                        {"index", idx < 0 ? Value::none() : Value::integer(idx)}};
    if (offset) kv.emplace_back("offset", size(*offset));
    ValuePtr i = newobj(f_.meta_module, "MetadataIndex");
    i->set_state(dict(std::move(kv)));
    return i;
  }
  ValuePtr info(const std::string& path, std::int64_t offset, std::int64_t length, bool transforms) {
    std::vector<std::pair<std::string, ValuePtr>> kv = {
        {"relative_path", str(path)}, {"offset", Value::integer(offset)}, {"length", Value::integer(length)}};
    if (transforms) kv.emplace_back("transform_descriptors", Value::list({str("stream.zstd/1")}));
    ValuePtr i = newobj(f_.fs_module, "_StorageInfo");
    i->set_state(dict(std::move(kv)));
    return i;
  }

  const Form& f_;
  std::map<std::string, ValuePtr> globals_;
};

std::string form_bytes(const Form& f, int protocol) {
  ValuePtr root = FormBuilder(f).build();
  return pickle::pickle_to_string(*root, pickle::WriteOptions{.protocol = protocol});
}

Metadata decode(const std::string& bytes) { return decode_metadata(as_bytes(bytes), ".metadata"); }

class FormTest : public ::testing::TestWithParam<std::tuple<Form, int>> {};

TEST_P(FormTest, DecodesEveryField) {
  const auto& [form, protocol] = GetParam();
  Metadata md = decode(form_bytes(form, protocol));
  expect_sample(md, form.planner_data, form.transforms);
  if (form.checkpoint_id == Form::Id::kAbsent) {
    EXPECT_FALSE(md.storage_meta.has_value());
  } else {
    ASSERT_TRUE(md.storage_meta.has_value());
    switch (form.checkpoint_id) {
      case Form::Id::kNone: EXPECT_FALSE(md.storage_meta->checkpoint_id.has_value()); break;
      case Form::Id::kWindows: EXPECT_EQ(md.storage_meta->checkpoint_id, "C:\\tmp\\ckpt"); break;
      default: EXPECT_EQ(md.storage_meta->checkpoint_id, "/tmp/ckpt"); break;
    }
    EXPECT_EQ(md.storage_meta->save_id, "3f2c6a1e-save");
    EXPECT_FALSE(md.storage_meta->load_id.has_value());
    EXPECT_EQ(md.storage_meta->modules,
              form.modules ? std::vector<std::string>({"model", "opt"}) : std::vector<std::string>{});
  }
  EXPECT_EQ(md.version, form.version ? std::optional<std::string>("1.0.0") : std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(AllReleases, FormTest,
                         ::testing::Combine(::testing::ValuesIn(all_forms()), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string n =
                               std::get<0>(info.param).name + "_p" + std::to_string(std::get<1>(info.param));
                           for (char& c : n) {
                             if (c == '.') c = '_';
                           }
                           return n;
                         });

// ---- encode ------------------------------------------------------------------------

TEST(MetadataCodecTest, RoundTrip) {
  for (bool transforms : {false, true}) {
    Metadata md = sample_metadata(transforms);
    Metadata back = decode(encode_metadata(md));
    expect_sample(back, true, transforms);
    EXPECT_TRUE(same_encoded_content(md, back));
  }
}

// PyTorch 2.9+ pickles TensorProperties with a sixth element, the strides (None or a
// tuple); both decode, and a decoded strides tuple survives a round trip.
TEST(MetadataCodecTest, SixTuplePropertiesWithStridesRoundTrip) {
  Metadata md = sample_metadata();
  auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.w"));
  w.properties.strides = Shape{w.size.size() > 1 ? w.size[1] : 1, 1};
  w.properties.strides->resize(w.size.size(), 1);
  Metadata back = decode(encode_metadata(md));
  EXPECT_EQ(std::get<TensorStorageMetadata>(back.state_dict_metadata.at("model.w")).properties.strides,
            w.properties.strides);
  EXPECT_FALSE(std::get<TensorStorageMetadata>(back.state_dict_metadata.at("model.b")).properties.strides);
}

TEST(MetadataCodecTest, KeyOrderIsTheOrderTheFileListsTheKeys) {
  const Metadata md = sample_metadata(false);
  std::vector<std::string> sorted;
  for (const auto& [fqn, _] : md.state_dict_metadata) sorted.push_back(fqn);
  EXPECT_EQ(decode(encode_metadata(md)).key_order, sorted);
  // The same file with state_dict_metadata's entries reversed (as a saver whose state dict
  // had the other order would write it).
  ValuePtr root = pickle::read_pickle(as_bytes(encode_metadata(md)), "encoded");
  ValuePtr sdm = root->state()->get("state_dict_metadata");
  ASSERT_TRUE(sdm && sdm->is(Kind::kDict));
  std::reverse(sdm->mutable_entries().begin(), sdm->mutable_entries().end());
  const Metadata reversed = decode(pickle::pickle_to_string(*root, pickle::WriteOptions{.protocol = 2}));
  EXPECT_EQ(reversed.key_order, std::vector<std::string>(sorted.rbegin(), sorted.rend()));
  EXPECT_EQ(reversed.state_dict_metadata.size(), sorted.size());
}

TEST(MetadataCodecTest, RoundTripAllDTypesAndMemoryFormats) {
  Metadata md;
  int n = 0;
  for (DType d : kAllDTypes) {
    TensorStorageMetadata t;
    t.properties.dtype = d;
    t.properties.pin_memory = n % 2 == 0;
    t.properties.memory_format = n % 3;
    t.size = {3};
    t.chunks = {{{0}, {3}}};
    md.state_dict_metadata.emplace("t" + std::to_string(n++), t);
  }
  Metadata back = decode(encode_metadata(md));
  EXPECT_EQ(back.state_dict_metadata, md.state_dict_metadata);
}

TEST(MetadataCodecTest, EncodeIsDeterministicAndDropsStorageMetaAndVersion) {
  Metadata a = sample_metadata();
  Metadata b = sample_metadata();
  b.storage_meta = StorageMeta{"/x", "id", std::nullopt, {"m"}};
  b.version = "1.0.0";
  b.planner_data_raw = Value::dict();
  EXPECT_EQ(encode_metadata(a), encode_metadata(a));
  EXPECT_EQ(encode_metadata(a), encode_metadata(b));
  Metadata back = decode(encode_metadata(b));
  EXPECT_FALSE(back.storage_meta.has_value());
  EXPECT_FALSE(back.version.has_value());
}

TEST(MetadataCodecTest, EncodeFillsPlannerDataAndIndexHints) {
  Metadata md = sample_metadata();
  md.planner_data.clear();
  // Index hints missing: encode derives the chunk position from the offset.
  std::map<MetadataIndex, StorageInfo> sd;
  for (const auto& [k, v] : md.storage_data) {
    MetadataIndex key = k;
    key.index.reset();
    sd.emplace(key, v);
  }
  md.storage_data = sd;
  Metadata back = decode(encode_metadata(md));
  EXPECT_EQ(back.planner_data.size(), 4u);
  EXPECT_EQ(back.planner_data.at("model.w"), ObjectPath{std::string("model.w")});
  EXPECT_EQ(back.storage_data.find(MetadataIndex{"model.w", Shape{2, 0}, {}})->first.index, 1);
  EXPECT_EQ(back.storage_data.find(MetadataIndex{"model.w", Shape{0, 0}, {}})->first.index, 0);
  EXPECT_EQ(back.storage_data.find(MetadataIndex{"step", std::nullopt, {}})->first.index, std::nullopt);
}

// Walks a value tree collecting every global.
void collect_globals(const ValuePtr& v, std::set<std::string>& out, int depth = 0) {
  if (!v || depth > 100) return;
  if (v->is(Kind::kGlobal)) out.insert(v->module() + "." + v->name());
  if (v->is(Kind::kObject)) {
    collect_globals(v->callable(), out, depth + 1);
    collect_globals(v->args(), out, depth + 1);
    collect_globals(v->state(), out, depth + 1);
  }
  if (v->is(Kind::kTuple) || v->is(Kind::kList)) {
    for (const auto& i : v->items()) collect_globals(i, out, depth + 1);
  }
  if (v->is(Kind::kDict)) {
    for (const auto& [k, x] : v->entries()) {
      collect_globals(k, out, depth + 1);
      collect_globals(x, out, depth + 1);
    }
  }
}

std::vector<std::string> keys(const ValuePtr& dict) {
  std::vector<std::string> out;
  for (const auto& [k, v] : dict->entries()) out.push_back(k->as_string());
  return out;
}

void expect_newobj(const ValuePtr& v, const std::string& module, const std::string& name) {
  ASSERT_TRUE(v && v->is(Kind::kObject));
  EXPECT_EQ(v->call_kind(), CallKind::kNewObj);
  EXPECT_TRUE(v->callable()->is_global(module, name)) << module << "." << name;
  ASSERT_TRUE(v->args()->is(Kind::kTuple));
  EXPECT_TRUE(v->args()->items().empty());
}

void expect_size(const ValuePtr& v, const Shape& want) {
  ASSERT_TRUE(v && v->is(Kind::kObject));
  EXPECT_EQ(v->call_kind(), CallKind::kReduce);
  EXPECT_TRUE(v->callable()->is_global("torch", "Size"));
  ASSERT_EQ(v->args()->items().size(), 1u);
  const ValuePtr& t = v->args()->items()[0];
  ASSERT_TRUE(t->is(Kind::kTuple));
  Shape got;
  for (const auto& d : t->items()) got.push_back(d->as_int());
  EXPECT_EQ(got, want);
}

TEST(MetadataCodecTest, EncodeFollowsTheRecipeExactly) {
  const std::string meta = "torch.distributed.checkpoint.metadata";
  const std::string shard = "torch.distributed._shard.sharded_tensor.metadata";
  std::string bytes = encode_metadata(sample_metadata());
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x80);  // PROTO
  EXPECT_EQ(bytes[1], 2);
  ValuePtr root = pickle::read_pickle(as_bytes(bytes), "encoded");
  expect_newobj(root, meta, "Metadata");
  ASSERT_TRUE(root->state()->is(Kind::kDict));
  EXPECT_EQ(keys(root->state()), (std::vector<std::string>{"state_dict_metadata", "planner_data", "storage_data"}));

  ValuePtr sdm = root->state()->get("state_dict_metadata");
  EXPECT_EQ(keys(sdm), (std::vector<std::string>{"model.b", "model.w", "s", "step"}));
  ValuePtr w = sdm->get("model.w");
  expect_newobj(w, meta, "TensorStorageMetadata");
  EXPECT_EQ(keys(w->state()), (std::vector<std::string>{"properties", "size", "chunks"}));
  ValuePtr props = w->state()->get("properties");
  expect_newobj(props, shard, "TensorProperties");
  ASSERT_TRUE(props->state()->is(Kind::kTuple));
  const auto& p = props->state()->items();
  ASSERT_EQ(p.size(), 5u);
  EXPECT_TRUE(p[0]->is_global("torch", "float32"));
  EXPECT_TRUE(p[1]->callable()->is_global("torch.serialization", "_get_layout"));
  EXPECT_EQ(p[1]->call_kind(), CallKind::kReduce);
  EXPECT_EQ(p[1]->args()->items()[0]->as_string(), "torch.strided");
  EXPECT_FALSE(p[2]->as_bool());
  EXPECT_EQ(p[3]->call_kind(), CallKind::kReduce);
  EXPECT_TRUE(p[3]->callable()->is_global(shard, "MEM_FORMAT_ENCODING"));
  ASSERT_EQ(p[3]->args()->items().size(), 1u);
  EXPECT_EQ(p[3]->args()->items()[0]->as_int(), 0);
  EXPECT_FALSE(p[4]->as_bool());
  expect_size(w->state()->get("size"), {4, 6});
  ValuePtr chunks = w->state()->get("chunks");
  ASSERT_TRUE(chunks->is(Kind::kList));
  ASSERT_EQ(chunks->items().size(), 2u);
  expect_newobj(chunks->items()[1], meta, "ChunkStorageMetadata");
  EXPECT_EQ(keys(chunks->items()[1]->state()), (std::vector<std::string>{"offsets", "sizes"}));
  expect_size(chunks->items()[1]->state()->get("offsets"), {2, 0});
  expect_size(chunks->items()[1]->state()->get("sizes"), {2, 6});
  // model.b: requires_grad recorded.
  EXPECT_TRUE(sdm->get("model.b")->state()->get("properties")->state()->items()[2]->as_bool());
  ValuePtr step = sdm->get("step");
  expect_newobj(step, meta, "BytesStorageMetadata");
  ASSERT_TRUE(step->state() && step->state()->is(Kind::kDict));
  EXPECT_TRUE(step->state()->entries().empty());

  ValuePtr planner = root->state()->get("planner_data");
  ASSERT_TRUE(planner->is(Kind::kDict));
  EXPECT_EQ(keys(planner), (std::vector<std::string>{"model.b", "model.w", "opt.0.lr", "s", "step"}));
  ValuePtr lr = planner->get("opt.0.lr");
  ASSERT_TRUE(lr->is(Kind::kTuple));
  ASSERT_EQ(lr->items().size(), 3u);
  EXPECT_EQ(lr->items()[1]->as_int(), 0);

  ValuePtr sd = root->state()->get("storage_data");
  ASSERT_TRUE(sd->is(Kind::kDict));
  ASSERT_EQ(sd->entries().size(), 5u);
  int bytes_keys = 0;
  for (const auto& [k, v] : sd->entries()) {
    expect_newobj(k, meta, "MetadataIndex");
    expect_newobj(v, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    EXPECT_EQ(keys(v->state()), (std::vector<std::string>{"relative_path", "offset", "length"}));
    const std::string fqn = k->state()->get("fqn")->as_string();
    if (fqn == "step") {
      ++bytes_keys;
      EXPECT_EQ(keys(k->state()), (std::vector<std::string>{"fqn", "index"}));
      EXPECT_TRUE(k->state()->get("index")->is_none());
      EXPECT_EQ(v->state()->get("offset")->as_int(), 2194);
      EXPECT_EQ(v->state()->get("length")->as_int(), 431);
    } else {
      EXPECT_EQ(keys(k->state()), (std::vector<std::string>{"fqn", "index", "offset"}));
      EXPECT_TRUE(k->state()->get("index")->is(Kind::kInt));
    }
    if (fqn == "s") expect_size(k->state()->get("offset"), {});
  }
  EXPECT_EQ(bytes_keys, 1);

  std::set<std::string> globals;
  collect_globals(root, globals);
  const std::set<std::string> allowed = {meta + ".Metadata",
                                         meta + ".TensorStorageMetadata",
                                         meta + ".ChunkStorageMetadata",
                                         meta + ".BytesStorageMetadata",
                                         meta + ".MetadataIndex",
                                         "torch.distributed.checkpoint.filesystem._StorageInfo",
                                         shard + ".TensorProperties",
                                         shard + ".MEM_FORMAT_ENCODING",
                                         "torch.Size",
                                         "torch.serialization._get_layout",
                                         "torch.float32",
                                         "torch.bfloat16",
                                         "torch.int64"};
  EXPECT_EQ(globals, allowed);
}

TEST(MetadataCodecTest, EncodeWritesTransformDescriptorsOnlyWhenSet) {
  ValuePtr root = pickle::read_pickle(as_bytes(encode_metadata(sample_metadata(true))), "encoded");
  int with = 0;
  for (const auto& [k, v] : root->state()->get("storage_data")->entries()) {
    if (ValuePtr t = v->state()->get("transform_descriptors")) {
      ++with;
      ASSERT_TRUE(t->is(Kind::kList));
      EXPECT_EQ(t->items()[0]->as_string(), "stream.zstd/1");
    }
  }
  EXPECT_EQ(with, 1);
}

TEST(MetadataCodecTest, EncodeRefusesWhatCannotBeDecoded) {
  auto with_tensor = [](auto edit) {
    Metadata md = sample_metadata();
    edit(std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.w")));
    return md;
  };
  EXPECT_THROW(encode_metadata(with_tensor([](TensorStorageMetadata& t) { t.size = {4, -6}; })), UsageError);
  EXPECT_THROW(encode_metadata(with_tensor([](TensorStorageMetadata& t) { t.properties.memory_format = 3; })),
               UsageError);
  EXPECT_THROW(encode_metadata(with_tensor([](TensorStorageMetadata& t) { t.chunks[0].offsets = {0}; })), UsageError);
  Metadata md = sample_metadata();
  md.storage_data.begin()->second.length = std::uint64_t{1} << 63;
  EXPECT_THROW(encode_metadata(md), UsageError);
  try {
    encode_metadata(with_tensor([](TensorStorageMetadata& t) { t.chunks[1].sizes = {2, -1}; }));
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "encode_metadata: state_dict_metadata[\"model.w\"].chunks[1]: offsets [2, 0] and sizes [2, -1] must "
              "be non-negative and of the tensor's rank 2");
  }
}

TEST(MetadataCodecTest, EmptyMetadataRoundTrips) {
  Metadata md;
  Metadata back = decode(encode_metadata(md));
  EXPECT_TRUE(back.state_dict_metadata.empty());
  EXPECT_TRUE(back.storage_data.empty());
  EXPECT_NE(back.planner_data_raw, nullptr);  // written as {} (never None)
}

// ---- tolerance ---------------------------------------------------------------------

ValuePtr minimal_root(ValuePtr state) {
  ValuePtr root = Value::object(CallKind::kNewObj, Value::global("torch.distributed.checkpoint.metadata", "Metadata"),
                                Value::tuple());
  root->set_state(std::move(state));
  return root;
}

std::string pickled(const ValuePtr& v, int protocol = 4) {
  return pickle::pickle_to_string(*v, pickle::WriteOptions{.protocol = protocol});
}

TEST(MetadataCodecTest, MissingOptionalFieldsAreFine) {
  Metadata md = decode(pickled(minimal_root(dict({{"state_dict_metadata", Value::dict()}}))));
  EXPECT_TRUE(md.state_dict_metadata.empty());
  EXPECT_TRUE(md.storage_data.empty());
  EXPECT_EQ(md.planner_data_raw, nullptr);
  EXPECT_FALSE(md.storage_meta.has_value());
  EXPECT_FALSE(md.version.has_value());
}

TEST(MetadataCodecTest, PlannerDataKeepsRawAndSkipsNonPathEntries) {
  ValuePtr pd = dict({{"a", Value::tuple({str("a")})},
                      {"b", Value::list({Value::dict()})},
                      {"c", Value::list({str("x"), Value::integer(3)})}});
  Metadata md = decode(pickled(minimal_root(dict({{"state_dict_metadata", Value::dict()}, {"planner_data", pd}}))));
  EXPECT_EQ(md.planner_data.size(), 2u);
  EXPECT_EQ(md.planner_data.at("c"), (ObjectPath{std::string("x"), std::int64_t{3}}));
  ASSERT_NE(md.planner_data_raw, nullptr);
  EXPECT_TRUE(pickle::deep_equal(*md.planner_data_raw, *pd));

  // Not a dict at all: kept raw only.
  Metadata other = decode(pickled(minimal_root(
      dict({{"state_dict_metadata", Value::dict()}, {"planner_data", Value::list({Value::integer(1)})}}))));
  EXPECT_TRUE(other.planner_data.empty());
  ASSERT_NE(other.planner_data_raw, nullptr);
  EXPECT_TRUE(other.planner_data_raw->is(Kind::kList));
}

TEST(MetadataCodecTest, UnknownCheckpointIdObjectKeptAsRepr) {
  ValuePtr sm = Value::object(CallKind::kNewObj, Value::global("torch.distributed.checkpoint.metadata", "StorageMeta"),
                              Value::tuple());
  sm->set_state(dict({{"checkpoint_id", Value::call("upath", "UPath", {str("s3://b/x")})}}));
  Metadata md = decode(pickled(minimal_root(dict({{"state_dict_metadata", Value::dict()}, {"storage_meta", sm}}))));
  ASSERT_TRUE(md.storage_meta && md.storage_meta->checkpoint_id);
  EXPECT_NE(md.storage_meta->checkpoint_id->find("s3://b/x"), std::string::npos);
}

// ---- errors ------------------------------------------------------------------------

std::string error_of(const std::string& bytes) {
  try {
    decode(bytes);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

// The sample in form 2.4 with one node replaced.
std::string sample_with(const std::function<void(ValuePtr&)>& edit) {
  Form f = all_forms()[4];
  ValuePtr root = FormBuilder(f).build();
  edit(root);
  return pickled(root);
}

ValuePtr& sdm_entry(ValuePtr& root, const std::string& fqn) {
  for (auto& [k, v] : root->state()->mutable_entries()) {
    if (k->as_string() != "state_dict_metadata") continue;
    for (auto& [k2, v2] : v->mutable_entries()) {
      if (k2->as_string() == fqn) return v2;
    }
  }
  throw std::runtime_error("no entry " + fqn);
}

TEST(MetadataCodecTest, ErrorNamesSourceFqnExpectedAndFound) {
  EXPECT_EQ(error_of(sample_with([](ValuePtr& r) { sdm_entry(r, "model.w") = Value::dict(); })),
            ".metadata: state_dict_metadata[\"model.w\"]: expected TensorStorageMetadata or "
            "BytesStorageMetadata, found builtins.dict");
}

TEST(MetadataCodecTest, ChunkRankMustMatchTensorRank) {
  std::string msg = error_of(sample_with([](ValuePtr& r) {
    ValuePtr t = sdm_entry(r, "model.w");
    for (auto& [k, v] : t->state()->mutable_entries()) {
      if (k->as_string() == "size") v = Value::call("torch", "Size", {Value::tuple({Value::integer(24)})});
    }
  }));
  EXPECT_NE(msg.find(".metadata: state_dict_metadata[\"model.w\"].chunks[0]: expected offsets and sizes of rank 1"),
            std::string::npos)
      << msg;
}

TEST(MetadataCodecTest, RejectsMalformedValues) {
  struct Case {
    std::string want;
    std::function<void(ValuePtr&)> edit;
  };
  auto set_field = [](ValuePtr obj, const std::string& key, ValuePtr value) {
    for (auto& [k, v] : obj->state()->mutable_entries()) {
      if (k->as_string() == key) {
        v = value;
        return;
      }
    }
    obj->state()->mutable_entries().emplace_back(Value::str(key), value);
  };
  std::vector<Case> cases = {
      {"state_dict_metadata[\"model.w\"].size[1]: expected a non-negative int, found builtins.int -6",
       [&](ValuePtr& r) {
         set_field(sdm_entry(r, "model.w"), "size",
                   Value::call("torch", "Size", {Value::tuple({Value::integer(4), Value::integer(-6)})}));
       }},
      {"state_dict_metadata[\"model.w\"].properties.dtype: unsupported dtype torch.qint8",
       [&](ValuePtr& r) {
         sdm_entry(r, "model.w")->state()->get("properties")->state()->mutable_items()[0] =
             Value::global("torch", "qint8");
       }},
      {"state_dict_metadata[\"model.w\"].properties.layout: unsupported layout torch.sparse_coo",
       [&](ValuePtr& r) {
         sdm_entry(r, "model.w")->state()->get("properties")->state()->mutable_items()[1] =
             Value::call("torch.serialization", "_get_layout", {str("torch.sparse_coo")});
       }},
      {"state_dict_metadata[\"model.w\"]: missing field 'chunks'",
       [&](ValuePtr& r) {
         auto& e = sdm_entry(r, "model.w")->state()->mutable_entries();
         e.pop_back();
       }},
      {"state_dict_metadata[\"model.b\"].properties state: expected a 5- or 6-tuple",
       [&](ValuePtr& r) { sdm_entry(r, "model.b")->state()->get("properties")->state()->mutable_items().pop_back(); }},
      {"the pickle's root: expected Metadata, found builtins.list", [&](ValuePtr& r) { r = Value::list(); }},
      {"Metadata.storage_meta: expected StorageMeta or None, found builtins.str",
       [&](ValuePtr& r) { set_field(r, "storage_meta", str("x")); }},
      {"Metadata.version: expected a str or None, found builtins.int 1",
       [&](ValuePtr& r) { set_field(r, "version", Value::integer(1)); }},
      {"storage_data key: expected MetadataIndex, found builtins.str",
       [&](ValuePtr& r) {
         set_field(r, "storage_data", Value::dict({{str("k"), Value::none()}}));
       }},
  };
  for (const Case& c : cases) {
    std::string msg = error_of(sample_with(c.edit));
    EXPECT_NE(msg.find(".metadata: " + c.want), std::string::npos) << "got: " << msg << "\nwant: " << c.want;
  }
}

TEST(MetadataCodecTest, RejectsNegativeStorageLength) {
  std::string msg = error_of(sample_with([](ValuePtr& r) {
    for (auto& [k, v] : r->state()->mutable_entries()) {
      if (k->as_string() != "storage_data") continue;
      ValuePtr info = v->entries()[0].second;
      for (auto& [k2, v2] : info->state()->mutable_entries()) {
        if (k2->as_string() == "length") v2 = Value::integer(-1);
      }
    }
  }));
  EXPECT_NE(msg.find("storage_data[MetadataIndex(fqn=\"model.w\", offset=[0, 0])].length: expected a "
                     "non-negative int, found builtins.int -1"),
            std::string::npos)
      << msg;
}

TEST(MetadataCodecTest, OverlappingChunksDecodeButTilingReportsThem) {
  std::string bytes = sample_with([](ValuePtr& r) {
    ValuePtr t = sdm_entry(r, "model.w");
    ValuePtr chunks = t->state()->get("chunks");
    ValuePtr second = chunks->items()[1];
    for (auto& [k, v] : second->state()->mutable_entries()) {
      if (k->as_string() == "offsets") {
        v = Value::call("torch", "Size", {Value::tuple({Value::integer(1), Value::integer(0)})});
      }
    }
  });
  Metadata md = decode(bytes);
  const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.w"));
  std::vector<std::string> problems = check_chunk_tiling(t);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], "chunk 1 [1:3, 0:6] overlaps chunk 0 [0:2, 0:6]");
}

// ---- corruption --------------------------------------------------------------------

void expect_no_crash(const std::string& bytes) {
  try {
    Metadata md = decode(bytes);
    (void)encode_metadata(md);
  } catch (const FormatError&) {
  }
}

TEST(MetadataCodecTest, EveryTruncationIsAnErrorNotACrash) {
  for (int protocol : {2, 4}) {
    std::string bytes = form_bytes(all_forms()[8], protocol);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      std::string cut = bytes.substr(0, n);
      EXPECT_THROW(decode(cut), FormatError) << "length " << n;
    }
  }
}

TEST(MetadataCodecTest, RandomByteFlipsNeverCrash) {
  std::mt19937 rng(1234);
  for (int protocol : {2, 4}) {
    const std::string bytes = form_bytes(all_forms()[9], protocol);
    for (int i = 0; i < 3000; ++i) {
      std::string m = bytes;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
      expect_no_crash(m);
    }
  }
}

// ---- tiling ------------------------------------------------------------------------

TensorStorageMetadata tensor_with(Shape size, std::vector<ChunkStorageMetadata> chunks) {
  TensorStorageMetadata t;
  t.size = std::move(size);
  t.chunks = std::move(chunks);
  return t;
}

TEST(ChunkTilingTest, ExactTilingHasNoProblems) {
  EXPECT_TRUE(check_chunk_tiling(tensor_with({4, 6}, {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}})).empty());
  EXPECT_TRUE(check_chunk_tiling(tensor_with({4, 6}, {{{0, 0}, {4, 3}}, {{0, 3}, {4, 3}}})).empty());
  EXPECT_TRUE(check_chunk_tiling(tensor_with({}, {{{}, {}}})).empty());
  // Empty chunks (a DTensor rank with no rows) are fine.
  EXPECT_TRUE(check_chunk_tiling(tensor_with({3}, {{{0}, {3}}, {{3}, {0}}})).empty());
  EXPECT_TRUE(check_chunk_tiling(tensor_with({0, 5}, {})).empty());
}

TEST(ChunkTilingTest, ReportsGapsOverlapsAndOutOfBounds) {
  EXPECT_EQ(check_chunk_tiling(tensor_with({4, 6}, {{{0, 0}, {2, 6}}})),
            std::vector<std::string>{"chunks cover 12 of 24 elements (gaps)"});
  EXPECT_EQ(check_chunk_tiling(tensor_with({4, 6}, {{{0, 0}, {4, 4}}, {{0, 2}, {4, 4}}})),
            std::vector<std::string>{"chunk 1 [0:4, 2:6] overlaps chunk 0 [0:4, 0:4]"});
  EXPECT_EQ(check_chunk_tiling(tensor_with({4}, {{{0}, {4}}, {{2}, {4}}})),
            (std::vector<std::string>{"chunk 1 [2:6] lies outside the tensor of size [4]"}));
  EXPECT_EQ(check_chunk_tiling(tensor_with({4}, {{{0}, {4}}, {{0, 0}, {4, 1}}})),
            (std::vector<std::string>{"chunk 1 [0:4, 0:1] has rank 2/2 (offsets/sizes), the tensor has rank 1"}));
  EXPECT_EQ(check_chunk_tiling(tensor_with({}, {{{}, {}}, {{}, {}}})),
            std::vector<std::string>{"chunk 1 [] overlaps chunk 0 []"});
  EXPECT_EQ(check_chunk_tiling(tensor_with({4}, {{{-1}, {5}}})).size(), 2u);  // negative + gap
}

TEST(ChunkTilingTest, VolumeArithmeticIsExact) {
  const std::int64_t big = std::int64_t{1} << 40;
  // 2^80 elements: does not fit, reported rather than wrapped.
  auto problems = check_chunk_tiling(tensor_with({big, big}, {{{0, 0}, {big, big}}}));
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("does not fit in 64 bits"), std::string::npos);
  // Huge but fitting: exact.
  const std::int64_t m = std::int64_t{1} << 31;
  EXPECT_TRUE(check_chunk_tiling(tensor_with({m, m}, {{{0, 0}, {m / 2, m}}, {{m / 2, 0}, {m / 2, m}}})).empty());
  // Offsets near INT64_MAX must not overflow the bound check.
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(check_chunk_tiling(tensor_with({4}, {{{max}, {max}}})).size(), 2u);
}

TEST(CheckMetadataTest, SampleIsConsistent) {
  EXPECT_TRUE(check_metadata(sample_metadata()).empty());
  EXPECT_TRUE(check_metadata(Metadata{}).empty());
}

TEST(CheckMetadataTest, ReportsEveryInconsistency) {
  Metadata md = sample_metadata();
  md.storage_data.erase(MetadataIndex{"model.w", Shape{2, 0}, {}});
  md.storage_data.erase(MetadataIndex{"step", std::nullopt, {}});
  md.storage_data.emplace(MetadataIndex{"ghost", std::nullopt, {}}, StorageInfo{"__0_0.distcp", 5000, 10, {}});
  md.storage_data.emplace(MetadataIndex{"model.b", Shape{3}, {}}, StorageInfo{"../x.distcp", 0, 10, {}});
  md.storage_data.at(MetadataIndex{"s", Shape{}, {}}).offset = 1000;  // inside model.b's [700, 1447)
  std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.b")).size = {7};
  std::vector<std::string> want = {
      "\"model.b\": chunks cover 6 of 7 elements (gaps)",
      "\"model.w\": chunk 1 [2:4, 0:6] has no storage_data entry",
      "\"step\": bytes item has no storage_data entry",
      "storage_data[\"ghost\"] names no item of state_dict_metadata",
      "storage_data[\"model.b\" at [3]] matches no chunk of the tensor",
      "storage_data[\"model.b\" at [3]]: relative_path '../x.distcp' is not a plain relative path",
      "storage_data[\"s\" at []] [1000+747] overlaps storage_data[\"model.b\" at [0]] [700+747] in '__0_0.distcp'",
  };
  EXPECT_EQ(check_metadata(md), want);
}

TEST(ChunkTilingTest, ManyChunksAreChecked) {
  std::vector<ChunkStorageMetadata> chunks;
  for (std::int64_t i = 0; i < 4096; ++i) chunks.push_back({{i, 0}, {1, 8}});
  EXPECT_TRUE(check_chunk_tiling(tensor_with({4096, 8}, chunks)).empty());
  chunks.push_back({{10, 4}, {1, 1}});
  auto problems = check_chunk_tiling(tensor_with({4096, 8}, chunks));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], "chunk 4096 [10:11, 4:5] overlaps chunk 10 [10:11, 0:8]");
}

}  // namespace
}  // namespace shardpoint::format
