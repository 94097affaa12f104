// interop_worker: one rank of the PyTorch 2.6 interop tests (dcp26_interop_test.cc). The
// communicator comes from make_communicator_from_env() (Gloo under launch_ranks).
//
//   interop_worker load DIR --expected FILE
//       Builds this rank's template from the manifest FILE (written by tests/interop/dcp26.py
//       or by `save` below): every tensor with dims is a Shard(0) box over a 1-D mesh of the
//       world size (chunking.h), 0-dim tensors whole, objects None placeholders, each at its
//       manifest path. Loads DIR with engine::load, then checks every box byte for byte
//       against interop_values.h and every object's repr against the manifest. Rank 0 also
//       checks .metadata (keys, dtypes, global shapes) through engine::read_metadata.
//   interop_worker save DIR --manifest FILE
//       Saves the state below (meant for 4 ranks; any world size works) with
//       thread_count = 2; rank 0 then writes the manifest FILE for dcp26.py.
//
// Exit codes: 0 ok, 1 a value differs, 2 an exception or bad usage. Output lines start with
// "rank R: ".
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/chunking.h"
#include "engine/flatten.h"
#include "interop/interop_values.h"
#include "pickle/repr.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"
#include "storage/local_storage.h"

namespace {

namespace se = shardpoint::engine;
namespace sp = shardpoint;
using nlohmann::json;
using shardpoint::pickle::Value;
using shardpoint::pickle::ValuePtr;

constexpr const char* kFormat = "shardpoint-interop/1";

int g_rank = -1;

void say(const std::string& line) {
  std::ostringstream s;
  s << "rank " << g_rank << ": " << line << "\n";
  std::cout << s.str() << std::flush;
}

se::ObjectPath path_from_json(const json& j) {
  se::ObjectPath path;
  for (const json& e : j) {
    if (e.is_string()) path.emplace_back(e.get<std::string>());
    else path.emplace_back(e.get<std::int64_t>());
  }
  return path;
}

json path_to_json(const se::ObjectPath& path) {
  json j = json::array();
  for (const auto& e : path) {
    if (const auto* s = std::get_if<std::string>(&e)) j.push_back(*s);
    else j.push_back(std::get<std::int64_t>(e));
  }
  return j;
}

// Tensor leaves of a template or a saved state, with the buffers they point into.
struct TensorLeaf {
  std::string fqn;
  sp::DType dtype;
  se::Shape shape;
  se::Box box;
  std::unique_ptr<std::vector<std::byte>> buffer;
};

se::TensorShard shard_of(TensorLeaf& leaf) {
  se::TensorShard t;
  t.dtype = leaf.dtype;
  t.global_shape = leaf.shape;
  t.offsets = leaf.box.offsets;
  t.sizes = leaf.box.sizes;
  t.data = std::span<std::byte>(leaf.buffer->data(), leaf.buffer->size());
  return t;
}

std::string first_difference(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  std::size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  return "bytes differ at " + std::to_string(k) + " of " + std::to_string(want.size());
}

// ---------------------------------------------------------------------------------------
// load

int run_load(const std::string& dir, const std::string& manifest_path, sp::comm::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  std::ifstream in(manifest_path);
  if (!in) throw std::runtime_error("cannot open manifest " + manifest_path);
  const json manifest = json::parse(in);
  if (manifest.value("format", "") != kFormat)
    throw std::runtime_error(manifest_path + ": not a " + kFormat + " manifest");
  const json& entries = manifest.at("entries");

  auto st = sp::storage::open_local_storage_at(dir);
  std::vector<std::string> problems;

  if (rank == 0) {
    const sp::format::Metadata md = se::read_metadata(*st);
    std::set<std::string> want_keys;
    for (const auto& [fqn, e] : entries.items()) want_keys.insert(fqn);
    for (const auto& [fqn, m] : md.state_dict_metadata) {
      if (!want_keys.contains(fqn)) problems.push_back(fqn + ": in .metadata but not in the manifest");
    }
    for (const auto& [fqn, e] : entries.items()) {
      auto it = md.state_dict_metadata.find(fqn);
      if (it == md.state_dict_metadata.end()) {
        problems.push_back(fqn + ": missing from .metadata");
        continue;
      }
      const bool tensor = e.at("kind") == "tensor";
      if (tensor != std::holds_alternative<sp::format::TensorStorageMetadata>(it->second)) {
        problems.push_back(fqn + ": .metadata kind differs from the manifest");
        continue;
      }
      if (!tensor) continue;
      const auto& tm = std::get<sp::format::TensorStorageMetadata>(it->second);
      if (std::string(sp::dtype_name(tm.properties.dtype)) != e.at("dtype").get<std::string>()) {
        problems.push_back(fqn + ": .metadata dtype " + std::string(sp::dtype_name(tm.properties.dtype)));
      }
      if (tm.size != e.at("shape").get<se::Shape>())
        problems.push_back(fqn + ": .metadata size " + se::shape_to_string(tm.size));
      auto pd = md.planner_data.find(fqn);
      if (pd != md.planner_data.end() && pd->second != path_from_json(e.at("path"))) {
        problems.push_back(fqn + ": planner_data path " + se::path_to_string(pd->second));
      }
    }
  }

  // The template.
  se::StateNode root{se::StateDict{}};
  std::vector<TensorLeaf> tensors;
  std::vector<std::pair<std::string, se::ObjectPath>> objects;
  for (const auto& [fqn, e] : entries.items()) {
    const se::ObjectPath path = path_from_json(e.at("path"));
    if (e.at("kind") == "tensor") {
      TensorLeaf leaf;
      leaf.fqn = fqn;
      const auto dtype = sp::dtype_from_name(e.at("dtype").get<std::string>());
      if (!dtype) throw std::runtime_error(fqn + ": unknown dtype " + e.at("dtype").dump());
      leaf.dtype = *dtype;
      leaf.shape = e.at("shape").get<se::Shape>();
      leaf.box = leaf.shape.empty() ? se::Box{} : se::shard_box(leaf.shape, {world}, {se::Placement::shard(0)}, {rank});
      leaf.buffer = std::make_unique<std::vector<std::byte>>(
          static_cast<std::size_t>(se::volume(leaf.box.sizes)) * sp::dtype_itemsize(leaf.dtype), std::byte{0xA5});
      se::set_at_path(root, path, se::StateNode(shard_of(leaf)));
      tensors.push_back(std::move(leaf));
    } else {
      se::set_at_path(root, path, se::StateNode(Value::none()));
      objects.emplace_back(fqn, path);
    }
  }

  const se::LoadReport report = se::load(root, *st, comm);

  for (const TensorLeaf& leaf : tensors) {
    const std::vector<std::byte> want = sp::interop::box_bytes(leaf.fqn, leaf.dtype, leaf.shape, leaf.box);
    if (*leaf.buffer != want) {
      problems.push_back(leaf.fqn + " box " + se::box_to_string(leaf.box.offsets, leaf.box.sizes) + ": " +
                         first_difference(*leaf.buffer, want));
    }
  }
  for (const auto& [fqn, path] : objects) {
    const se::StateNode* node = se::find_at_path(root, path);
    const std::string want = entries.at(fqn).at("repr").get<std::string>();
    if (node == nullptr || !node->is_object() || !node->object()) {
      problems.push_back(fqn + ": no object at its path after load");
      continue;
    }
    const std::string got = sp::pickle::repr(*node->object());
    if (got != want) problems.push_back(fqn + ": object " + got + " != expected " + want);
  }
  if (!problems.empty()) {
    for (const auto& p : problems) say("MISMATCH " + p);
    return 1;
  }
  say("load ok: " + std::to_string(tensors.size()) + " tensors, " + std::to_string(objects.size()) +
      " objects; needed " + std::to_string(report.bytes_needed) + " read " + std::to_string(report.bytes_read));
  return 0;
}

// ---------------------------------------------------------------------------------------
// save

struct TensorSpec {
  std::string fqn;
  sp::DType dtype;
  se::Shape shape;
  se::Shape mesh;  // empty: replicated (a plain tensor on every rank)
  std::vector<se::Placement> placements;
};

se::ObjectPath split_fqn(const std::string& fqn) {
  se::ObjectPath path;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = fqn.find('.', start);
    path.emplace_back(fqn.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return path;
    start = dot + 1;
  }
}

int run_save(const std::string& dir, const std::string& manifest_path, sp::comm::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  using P = se::Placement;
  const se::Shape mesh1{world};
  // (2, 2) on 4 ranks; (1, world) otherwise: still a 2-D mesh sharding two tensor dims.
  const se::Shape mesh2 = world == 4 ? se::Shape{2, 2} : se::Shape{1, world};
  const std::vector<TensorSpec> specs = {
      {"model.w", sp::DType::kFloat32, {10, 4}, mesh1, {P::shard(0)}},  // 4 ranks: 3, 3, 3, 1 rows
      {"model.v", sp::DType::kBFloat16, {3, 7}, mesh1, {P::shard(1)}},  // 2, 2, 2, 1 cols
      {"model.m2d", sp::DType::kFloat64, {6, 8}, mesh2, {P::shard(0), P::shard(1)}},
      {"model.e", sp::DType::kFloat16, {9}, mesh1, {P::shard(0)}},  // 3, 3, 3, 0 (an empty box)
      {"model.idx", sp::DType::kInt64, {7}, mesh1, {P::shard(0)}},
      {"model.mask", sp::DType::kBool, {5, 2}, mesh1, {P::shard(0)}},  // 2, 2, 1, 0
      {"model.i32", sp::DType::kInt32, {4, 3}, mesh1, {P::shard(1)}},  // 1, 1, 1, 0 cols
      {"model.rep", sp::DType::kFloat16, {5, 3}, {}, {}},              // replicated plain
      {"model.ids", sp::DType::kInt64, {6}, {}, {}},
      {"model.scalar", sp::DType::kFloat32, {}, {}, {}},  // 0-dim
      {"optimizer.state.w.step", sp::DType::kFloat32, {}, {}, {}},
      {"optimizer.state.w.exp_avg", sp::DType::kFloat32, {10, 4}, mesh1, {P::shard(0)}},
      {"optimizer.state.w.exp_avg_sq", sp::DType::kFloat32, {10, 4}, mesh1, {P::shard(0)}},
  };

  se::StateNode root{se::StateDict{}};
  std::vector<TensorLeaf> tensors;
  json entries = json::object();
  for (const TensorSpec& spec : specs) {
    TensorLeaf leaf;
    leaf.fqn = spec.fqn;
    leaf.dtype = spec.dtype;
    leaf.shape = spec.shape;
    if (spec.mesh.empty()) {
      leaf.box = se::Box{se::Shape(spec.shape.size(), 0), spec.shape};
    } else {
      // Row-major mesh coordinate of this rank (DeviceMesh over arange(world)).
      se::Shape coord(spec.mesh.size());
      std::int64_t r = rank;
      for (std::size_t d = spec.mesh.size(); d-- > 0;) {
        coord[d] = r % spec.mesh[d];
        r /= spec.mesh[d];
      }
      leaf.box = se::shard_box(spec.shape, spec.mesh, spec.placements, coord);
    }
    leaf.buffer =
        std::make_unique<std::vector<std::byte>>(sp::interop::box_bytes(leaf.fqn, leaf.dtype, leaf.shape, leaf.box));
    const se::ObjectPath path = split_fqn(spec.fqn);
    se::set_at_path(root, path, se::StateNode(shard_of(leaf)));
    entries[spec.fqn] = {{"path", path_to_json(path)},
                         {"kind", "tensor"},
                         {"dtype", std::string(sp::dtype_name(spec.dtype))},
                         {"shape", spec.shape}};
    tensors.push_back(std::move(leaf));
  }

  // Objects, with the repr Python must print for what it loads.
  auto object = [&](se::ObjectPath path, ValuePtr v, const std::string& python_repr) {
    entries[se::path_to_fqn(path)] = {{"path", path_to_json(path)}, {"kind", "object"}, {"repr", python_repr}};
    se::set_at_path(root, path, se::StateNode(std::move(v)));
  };
  const se::ObjectPath group{std::string("optimizer"), std::string("param_groups"), std::int64_t{0}};
  auto in_group = [&](const std::string& key) {
    se::ObjectPath p = group;
    p.emplace_back(key);
    return p;
  };
  object(in_group("lr"), Value::floating(0.1), "0.1");
  object(in_group("betas"), Value::tuple({Value::floating(0.9), Value::floating(0.999)}), "(0.9, 0.999)");
  object(in_group("weight_decay"), Value::floating(0.0), "0.0");
  object(in_group("params"), Value::list({Value::str("w")}), "['w']");
  object({std::string("epoch")}, Value::integer(7), "7");
  object({std::string("loss_scale")}, Value::floating(0.25), "0.25");
  object({std::string("tag")}, Value::str("run-\xce\xb1"), "'run-\xce\xb1'");
  object({std::string("milestones")}, Value::list({Value::integer(10), Value::integer(20), Value::integer(30)}),
         "[10, 20, 30]");
  object({std::string("extra"), std::string("seed")}, Value::integer(1234), "1234");
  object({std::string("extra"), std::string("ratio")}, Value::floating(0.5), "0.5");
  object({std::string("extra"), std::string("name")}, Value::str("x"), "'x'");
  object({std::string("extra"), std::string("big")}, Value::integer(std::int64_t{1} << 40), "1099511627776");
  object({std::string("extra"), std::string("flag")}, Value::boolean(true), "True");

  se::SaveOptions options;
  options.thread_count = 2;
  const se::SaveReport report = se::save(root, *sp::storage::open_local_storage_at(dir), comm, options);
  if (rank == 0) {
    const json manifest = {{"format", kFormat}, {"writer", "shardpoint"}, {"world_size", world}, {"entries", entries}};
    const std::string tmp = manifest_path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << manifest.dump(1) << "\n";
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, manifest_path);
  }
  say("saved " + std::to_string(report.bytes_written) + " bytes in " + std::to_string(report.files.size()) + " files");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 || (std::string(argv[3]) != "--expected" && std::string(argv[3]) != "--manifest")) {
    std::cerr << "usage: interop_worker load DIR --expected FILE | save DIR --manifest FILE\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    auto comm = sp::comm::make_communicator_from_env(sp::comm::CommOptions{std::chrono::seconds(60)});
    g_rank = comm->rank();
    if (mode == "load") return run_load(argv[2], argv[4], *comm);
    if (mode == "save") return run_save(argv[2], argv[4], *comm);
    say("unknown mode " + mode);
    return 2;
  } catch (const std::exception& e) {
    say(std::string("exception: ") + e.what());
    return 2;
  }
}
