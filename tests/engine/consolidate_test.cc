// consolidate(): Lightning's layouts over checkpoints saved by save() on 2-3 in-process
// ranks (uneven dim-0 shards, dim-1 shards, bf16, 0-dim, nested optimizer state), read back
// with TorchFile; validation messages; atomic output on failures and cancellation; peak RSS
// under the budget on a checkpoint 4x larger than the budget; safetensors output; a bytes
// item whose object holds tensors.
#include "shardpoint/consolidate.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "engine/object_item_checkpoint.h"
#include "engine/torch_save.h"
#include "format/metadata_codec.h"
#include "format/safetensors_writer.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/local_storage.h"
#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using shardpoint::testing::TempDir;
using testing::box_bytes;
using testing::make_rank_state;
using testing::RankState;
using testing::tensor_specs;
using testing::TensorSpec;

// Renames the top-level key `from` of root to `to` (keeps its position).
void rename_key(StateNode& root, const std::string& from, const std::string& to) {
  for (auto& [k, v] : root.dict()) {
    if (k == from) k = to;
  }
}

// Saves the test state on `world` ranks into folder, with "optim" renamed to
// "optimizer_0" (Lightning's Trainer key) when trainer_keys.
void save_state(const std::string& folder, int world, bool trainer_keys = true) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) {
    states.push_back(make_rank_state(r, world, true));
    if (trainer_keys) rename_key(states.back().root, "optim", "optimizer_0");
  }
  auto st = storage::open_local_storage_at(folder);
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(20)});
  group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, *st, comm); });
}

// A Lightning-shaped meta.pt (docs/lightning-layout.md §3.2-3.3) with a tensor inside the ModelCheckpoint state.
std::vector<float> g_inf{INFINITY};
void write_meta_pt(const std::string& folder) {
  StateNode root{StateDict{}};
  root.set("epoch", StateNode(Value::integer(1)));
  root.set("global_step", StateNode(Value::integer(3)));
  root.set("pytorch-lightning_version", StateNode(Value::str("2.6.0")));
  root.set(
      "loops",
      StateNode(Value::dict(
          {{Value::str("fit_loop"),
            Value::dict({{Value::str("epoch_progress"), Value::dict({{Value::str("total"), Value::integer(2)}})}})}})));
  StateDict ckpt;
  ckpt.emplace_back("monitor", StateNode(Value::none()));
  TensorShard kth;
  kth.dtype = DType::kFloat32;
  kth.data = std::as_writable_bytes(std::span<float>(g_inf));
  ckpt.emplace_back("kth_value", StateNode(kth));
  ckpt.emplace_back("best_k_models", StateNode(StateDict{}));
  StateDict callbacks;
  callbacks.emplace_back("ModelCheckpoint{'monitor': None, 'mode': 'min'}", StateNode(std::move(ckpt)));
  root.set("callbacks", StateNode(std::move(callbacks)));
  root.set("lr_schedulers", StateNode(Value::list()));
  StringSink sink;
  write_torch_save(root, sink, TorchSaveFileOptions{"meta"});
  std::ofstream(folder + "/meta.pt", std::ios::binary) << sink.str();
}

std::vector<std::string> keys_of(const Value& dict) {
  std::vector<std::string> out;
  for (const auto& [k, v] : dict.entries()) out.push_back(k->as_string());
  return out;
}

std::vector<std::byte> tensor_bytes(const torchfile::TorchFile& f, const Value& node) {
  const torchfile::TensorInfo* info = f.tensor_of(node);
  EXPECT_NE(info, nullptr);
  if (info == nullptr) return {};
  std::vector<std::byte> out(info->nbytes());
  f.read_tensor(*info, out);
  return out;
}

std::vector<std::byte> expected_bytes(const std::string& path) {
  for (const TensorSpec& spec : tensor_specs()) {
    if (spec.path == path) return box_bytes(spec, Box{Shape(spec.shape.size(), 0), spec.shape});
  }
  ADD_FAILURE() << "no spec " << path;
  return {};
}

ConsolidateOptions options_for(const std::string& folder, const std::string& output = "") {
  ConsolidateOptions o;
  o.checkpoint_folder = Location::parse(folder);
  if (!output.empty()) o.output_file = Location::parse(output);
  o.durable = false;
  return o;
}

// Nothing but the checkpoint folder in dir (no output, no temporary).
void expect_only_folder(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt"});
}

// A bytes item whose object holds tensors keeps its tree; its storage (referenced by two
// views) is copied once under the output's next key, as dcp_to_torch_save writes it.
TEST(ConsolidateTest, ObjectItemHoldingTensorsKeepsItsTreeAndStorage) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  fs::create_directories(folder);
  const testing::ObjectItemCheckpoint c =
      testing::write_object_item_checkpoint(*storage::open_local_storage_at(folder));
  ConsolidateOptions o = options_for(folder, dir.file("out.pt"));
  o.layout = ConsolidateLayout::kDcp;
  const ConsolidateReport report = consolidate(o);
  EXPECT_EQ(report.objects, 1u);
  EXPECT_EQ(report.tensors, 2u);  // records: "w" and the object's one storage

  auto f = torchfile::TorchFile::open(dir.file("out.pt"));
  const ValuePtr pair = f->root()->get("pair");
  ASSERT_TRUE(pair && pair->is(Kind::kTuple) && pair->items().size() == 3);
  EXPECT_EQ(pair->items()[1]->as_string(), "l2");
  const torchfile::TensorInfo* a = f->tensor_of(*pair->items()[0]);
  const torchfile::TensorInfo* b = f->tensor_of(*pair->items()[2]);
  const torchfile::TensorInfo* w = f->tensor_of(*f->root()->get("w"));
  ASSERT_TRUE(a && b && w);
  EXPECT_EQ(a->storage_key, b->storage_key);
  EXPECT_NE(a->storage_key, w->storage_key);
  EXPECT_EQ(b->storage_offset, 1);
  EXPECT_EQ(b->shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(f->storages().size(), 2u);
  EXPECT_EQ(f->archive().read(*f->record("data/" + a->storage_key)), c.pair_storage);
  EXPECT_EQ(f->archive().read(*f->record("data/" + w->storage_key)), c.w_bytes);
}

TEST(ConsolidateTest, TrainerLayoutMatchesLightning) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 3);
  write_meta_pt(folder);
  ConsolidateReport report = consolidate(options_for(folder + "/"));
  EXPECT_EQ(report.output.to_string(), folder + ".consolidated");
  EXPECT_EQ(report.tensors, tensor_specs().size() + 1);

  auto f = torchfile::TorchFile::open(folder + ".consolidated");
  EXPECT_EQ(f->archive_name(), "ckpt");
  const Value& root = *f->root();
  EXPECT_EQ(keys_of(root),
            (std::vector<std::string>{"epoch", "tag", "global_step", "pytorch-lightning_version", "loops", "callbacks",
                                      "lr_schedulers", "state_dict", "optimizer_states"}));
  // meta.pt's epoch (1) replaced the DCP epoch (7) in place.
  EXPECT_EQ(root.get("epoch")->as_int(), 1);
  const Value& sd = *root.get("state_dict");
  // shardpoint's .metadata keeps keys sorted (no planner_data order to follow).
  EXPECT_EQ(keys_of(sd), (std::vector<std::string>{"c", "rep", "scalar", "v", "w"}));
  for (const char* k : {"w", "v", "c", "rep", "scalar"}) {
    EXPECT_EQ(tensor_bytes(*f, *sd.get(k)), expected_bytes(std::string("model.") + k)) << k;
    EXPECT_EQ(f->tensor_of(*sd.get(k))->location, "cpu");
  }
  EXPECT_TRUE(f->tensor_of(*sd.get("scalar"))->shape.empty());
  const Value& opts = *root.get("optimizer_states");
  ASSERT_TRUE(opts.is(Kind::kList));
  ASSERT_EQ(opts.items().size(), 1u);
  const Value& opt0 = *opts.items()[0];
  const Value& state0 = *opt0.get("state")->get("0");
  EXPECT_EQ(tensor_bytes(*f, *state0.get("exp_avg")), expected_bytes("optim.state.0.exp_avg"));
  EXPECT_EQ(state0.get("step")->as_int(), 3);
  const Value& group = *opt0.get("param_groups")->items()[0];
  EXPECT_DOUBLE_EQ(group.get("lr")->as_float(), 0.01);
  // The tensor inside meta.pt's ModelCheckpoint state is carried through.
  const Value& cb = *root.get("callbacks")->get("ModelCheckpoint{'monitor': None, 'mode': 'min'}");
  auto kth = tensor_bytes(*f, *cb.get("kth_value"));
  ASSERT_EQ(kth.size(), 4u);
  float v;
  std::memcpy(&v, kth.data(), 4);
  EXPECT_TRUE(std::isinf(v));
}

TEST(ConsolidateTest, TrainerLayoutPopsOptimizersByIndexAndKeepsOthers) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  // Two optimizers saved under optimizer_1 and optimizer_0, plus optimizer_abc.
  std::vector<RankState> states;
  for (int r = 0; r < 2; ++r) {
    states.push_back(make_rank_state(r, 2, true));
    rename_key(states.back().root, "optim", "optimizer_1");
    states.back().root.set("optimizer_0", StateNode(Value::str("first")));
    states.back().root.set("optimizer_abc", StateNode(Value::integer(5)));
  }
  {
    auto st = storage::open_local_storage_at(folder);
    comm::ThreadGroup group(2);
    group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, *st, comm); });
  }
  write_meta_pt(folder);
  consolidate(options_for(folder));
  auto f = torchfile::TorchFile::open(folder + ".consolidated");
  const Value& root = *f->root();
  EXPECT_EQ(root.get("optimizer_abc")->as_int(), 5);
  const Value& opts = *root.get("optimizer_states");
  ASSERT_EQ(opts.items().size(), 2u);
  EXPECT_EQ(opts.items()[0]->as_string(), "first");
  EXPECT_TRUE(opts.items()[1]->is(Kind::kDict));
  EXPECT_EQ(keys_of(root).back(), "optimizer_states");
}

TEST(ConsolidateTest, TrainerLayoutGapInOptimizerIndicesFails) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  std::vector<RankState> states;
  states.push_back(make_rank_state(0, 1, true));
  rename_key(states.back().root, "optim", "optimizer_2");
  states.back().root.set("optimizer_0", StateNode(Value::str("first")));
  {
    auto st = storage::open_local_storage_at(folder);
    comm::ThreadGroup group(1);
    group.run([&](comm::Communicator& comm) { save(states[0].root, *st, comm); });
  }
  write_meta_pt(folder);
  try {
    consolidate(options_for(folder));
    FAIL() << "expected PlanError";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("KeyError: 'optimizer_1'"), std::string::npos) << e.what();
  }
  expect_only_folder(dir);
}

TEST(ConsolidateTest, FabricLayoutKeepsKeys) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 2);
  write_meta_pt(folder);
  auto o = options_for(folder, dir.file("out.pt"));
  o.layout = ConsolidateLayout::kFabric;
  consolidate(o);
  auto f = torchfile::TorchFile::open(dir.file("out.pt"));
  EXPECT_EQ(f->archive_name(), "out");
  EXPECT_EQ(keys_of(*f->root()),
            (std::vector<std::string>{"epoch", "model", "optimizer_0", "tag", "global_step",
                                      "pytorch-lightning_version", "loops", "callbacks", "lr_schedulers"}));
}

// A Lightning folder consolidated as plain DCP keeps meta.pt's trainer state, merged on
// top with the keys as saved (Lightning's _load_distributed_checkpoint): the fabric file.
TEST(ConsolidateTest, DcpLayoutOfALightningFolderKeepsMetaPt) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 2);
  write_meta_pt(folder);
  auto o = options_for(folder, dir.file("out.pt"));
  o.layout = ConsolidateLayout::kDcp;
  consolidate(o);
  auto f = torchfile::TorchFile::open(dir.file("out.pt"));
  const Value& root = *f->root();
  EXPECT_EQ(keys_of(root),
            (std::vector<std::string>{"epoch", "model", "optimizer_0", "tag", "global_step",
                                      "pytorch-lightning_version", "loops", "callbacks", "lr_schedulers"}));
  EXPECT_EQ(root.get("epoch")->as_int(), 1);  // meta.pt's, in the DCP key's place
  EXPECT_EQ(root.get("global_step")->as_int(), 3);
  EXPECT_EQ(tensor_bytes(*f, *root.get("model")->get("c")), expected_bytes("model.c"));
  const ValuePtr callbacks = root.get("callbacks");
  ASSERT_TRUE(callbacks && callbacks->is(Kind::kDict) && callbacks->entries().size() == 1);
  EXPECT_NE(f->tensor_of(*callbacks->entries()[0].second->get("kth_value")), nullptr);
}

TEST(ConsolidateTest, DcpLayoutWritesNestedState) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 3, /*trainer_keys=*/false);
  auto o = options_for(folder);
  o.layout = ConsolidateLayout::kDcp;
  o.memory_budget_bytes = 1 << 20;  // slabs of 256 KiB: many boxes per tensor
  consolidate(o);
  auto f = torchfile::TorchFile::open(folder + ".consolidated");
  const Value& root = *f->root();
  EXPECT_EQ(keys_of(root), (std::vector<std::string>{"epoch", "model", "optim", "tag"}));
  EXPECT_EQ(tensor_bytes(*f, *root.get("model")->get("c")), expected_bytes("model.c"));
  EXPECT_EQ(tensor_bytes(*f, *root.get("model")->get("v")), expected_bytes("model.v"));
  EXPECT_EQ(root.get("tag")->as_string(), "run-1");
}

TEST(ConsolidateTest, DcpLayoutPadsListsWithNone) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  auto st = storage::open_local_storage_at(folder);
  StateNode root{StateDict{}};
  StateList list;
  list.emplace_back(Value::integer(10));
  list.emplace_back(Value::integer(11));
  std::vector<float> w{1, 2, 3};
  StateDict holder;
  TensorShard t;
  t.global_shape = {3};
  t.offsets = {0};
  t.sizes = {3};
  t.data = std::as_writable_bytes(std::span<float>(w));
  holder.emplace_back("w", StateNode(t));
  list.emplace_back(std::move(holder));
  root.set("items", StateNode(std::move(list)));
  comm::ThreadGroup group(1);
  group.run([&](comm::Communicator& comm) { save(root, *st, comm); });
  // Drop items.0 from .metadata: the rebuilt list must be padded with None at index 0.
  format::Metadata md = read_metadata(*st);
  md.state_dict_metadata.erase("items.0");
  md.planner_data.erase("items.0");
  md.planner_data_raw = nullptr;
  for (auto it = md.storage_data.begin(); it != md.storage_data.end();) {
    it = it->first.fqn == "items.0" ? md.storage_data.erase(it) : std::next(it);
  }
  std::string bytes = format::encode_metadata(md);
  st->write_atomic(".metadata", as_bytes(bytes));
  st->remove(kChecksumSidecar);
  auto o = options_for(folder);
  o.layout = ConsolidateLayout::kDcp;
  consolidate(o);
  auto f = torchfile::TorchFile::open(folder + ".consolidated");
  const Value& items = *f->root()->get("items");
  ASSERT_EQ(items.items().size(), 3u);
  EXPECT_TRUE(items.items()[0]->is_none());
  EXPECT_EQ(items.items()[1]->as_int(), 11);
  EXPECT_EQ(tensor_bytes(*f, *items.items()[2]->get("w")).size(), 12u);
}

std::string error_of(const ConsolidateOptions& o) {
  try {
    consolidate(o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ConsolidateTest, ValidationMessagesInLightningOrder) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  EXPECT_EQ(error_of(options_for(folder + "/")), "The provided checkpoint folder does not exist: " + folder);
  shardpoint::testing::write_text(dir.file("file"), "x");
  EXPECT_EQ(error_of(options_for(dir.file("file"))),
            "The provided checkpoint path must be a folder, containing the checkpoint shards: " + dir.file("file"));
  save_state(folder, 1);
  EXPECT_EQ(error_of(options_for(folder)),
            "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
            "is not in that format: " +
                folder);
  write_meta_pt(folder);
  shardpoint::testing::write_text(dir.file("ckpt.consolidated"), "old");
  EXPECT_EQ(error_of(options_for(folder)),
            "The path for the converted checkpoint already exists. Choose a different path by providing "
            "`--output_file` or move/delete the file first: " +
                folder + ".consolidated");
  fs::remove(dir.file("ckpt.consolidated"));
  fs::create_directory(dir.file("outdir"));
  EXPECT_NE(error_of(options_for(folder, dir.file("outdir"))).find("already exists"), std::string::npos);
  fs::remove(dir.file("outdir"));
  fs::remove(dir.file("file"));
  std::string missing = error_of(options_for(folder, dir.file("no/such/dir/out.pt")));
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  expect_only_folder(dir);
}

// Damages the saved checkpoint in one way and expects one clear error and no output.
class ConsolidateBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = dir_.file("ckpt");
    save_state(folder_, 2);
    write_meta_pt(folder_);
  }
  std::string fail() {
    std::string e = error_of(options_for(folder_));
    EXPECT_FALSE(e.empty());
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    expect_only_folder(dir_);
    return e;
  }
  TempDir dir_;
  std::string folder_;
};

TEST_F(ConsolidateBadInputTest, TruncatedShard) {
  fs::resize_file(folder_ + "/__1_0.distcp", fs::file_size(folder_ + "/__1_0.distcp") - 100);
  std::string e = fail();
  EXPECT_NE(e.find("__1_0.distcp"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(ConsolidateBadInputTest, GarbageMetadata) {
  shardpoint::testing::write_text(folder_ + "/.metadata", "this is not a pickle");
  EXPECT_NE(fail().find(".metadata"), std::string::npos);
}

TEST_F(ConsolidateBadInputTest, MissingShard) {
  fs::remove(folder_ + "/__0_0.distcp");
  EXPECT_NE(fail().find("__0_0.distcp"), std::string::npos);
}

TEST_F(ConsolidateBadInputTest, RelativePathEscapingFolder) {
  auto st = storage::open_local_storage_at(folder_);
  format::Metadata md = read_metadata(*st);
  md.storage_data.begin()->second.relative_path = "../evil.distcp";
  std::string bytes = format::encode_metadata(md);
  st->write_atomic(".metadata", as_bytes(bytes));
  EXPECT_NE(fail().find("escapes the checkpoint folder"), std::string::npos);
}

TEST_F(ConsolidateBadInputTest, CorruptDataFailsChecksum) {
  // Flip bytes at the end of a shard file (tensor data of the last item).
  std::string path = folder_ + "/__0_0.distcp";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  auto size = fs::file_size(path);
  std::vector<char> all(size);
  f.read(all.data(), static_cast<std::streamsize>(size));
  auto meta = read_metadata(*storage::open_local_storage_at(folder_));
  for (const auto& [index, info] : meta.storage_data) {
    if (info.relative_path != "__0_0.distcp" || !index.offset) continue;
    // Damage one byte in the middle of each tensor blob (zip structure or data: either way
    // a clear error, never a silently wrong output).
    std::uint64_t at = info.offset + info.length / 2;
    f.seekp(static_cast<std::streamoff>(at));
    char x = static_cast<char>(all[at] ^ 0x5a);
    f.write(&x, 1);
  }
  f.close();
  std::string e = error_of(options_for(folder_));
  EXPECT_FALSE(e.empty());
  expect_only_folder(dir_);
}

TEST(ConsolidateTest, CancelledLeavesNothing) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 2);
  write_meta_pt(folder);
  std::atomic<int> cancel{0};
  auto o = options_for(folder);
  o.cancel = &cancel;
  EXPECT_THROW(consolidate(o,
                           [&](const ConsolidateProgress& p) {
                             if (p.bytes_done > 0) cancel.store(2);
                           }),
               Cancelled);
  expect_only_folder(dir);
}

// A checkpoint of ~64 MiB (float32 [4096, 4096] sharded over 4 ranks along dim 1, and a
// [1000, 4100] tensor in uneven dim-0 shards), consolidated with a 16 MiB budget in a
// child process: VmHWM grows by less than the budget.
TEST(ConsolidateTest, PeakMemoryStaysUnderBudget) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  {
    const int world = 4;
    std::vector<std::vector<float>> bufs;
    std::vector<StateNode> roots(world);
    for (int r = 0; r < world; ++r) {
      roots[r] = StateNode(StateDict{});
      StateDict model;
      Box a = shard_box({4096, 4096}, {world}, {Placement::shard(1)}, {r});
      Box b = shard_box({1000, 4100}, {world}, {Placement::shard(0)}, {r});
      for (const Box& box : {a, b}) {
        bufs.emplace_back(static_cast<std::size_t>(volume(box.sizes)), static_cast<float>(r));
      }
      TensorShard ta{DType::kFloat32,
                     {4096, 4096},
                     a.offsets,
                     a.sizes,
                     std::as_writable_bytes(std::span<float>(bufs[bufs.size() - 2]))};
      TensorShard tb{
          DType::kFloat32, {1000, 4100}, b.offsets, b.sizes, std::as_writable_bytes(std::span<float>(bufs.back()))};
      model.emplace_back("a", StateNode(ta));
      model.emplace_back("b", StateNode(tb));
      roots[r].set("model", StateNode(std::move(model)));
    }
    auto st = storage::open_local_storage_at(folder);
    comm::ThreadGroup group(world);
    group.run([&](comm::Communicator& comm) { save(roots[comm.rank()], *st, comm); });
  }
  write_meta_pt(folder);
  const std::size_t budget = std::size_t{16} << 20;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    auto status_kib = [](const char* field) -> long {
      std::ifstream in("/proc/self/status");
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
      }
      return -1;
    };
    { std::ofstream("/proc/self/clear_refs") << "5"; }
    long before = status_kib("VmRSS:");
    long code = 0;
    try {
      auto o = options_for(folder);
      o.memory_budget_bytes = budget;
      consolidate(o);
    } catch (...) {
      code = -1;
    }
    long grown = code < 0 ? -1 : status_kib("VmHWM:") - before;
    if (::write(fds[1], &grown, sizeof grown) != sizeof grown) _exit(3);
    _exit(0);
  }
  ::close(fds[1]);
  long grown_kib = -2;
  ASSERT_EQ(::read(fds[0], &grown_kib, sizeof grown_kib), static_cast<ssize_t>(sizeof grown_kib));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_GE(grown_kib, 0) << "consolidate failed in the child";
  const auto out_size = fs::file_size(folder + ".consolidated");
  EXPECT_GT(out_size, 4 * budget);
  EXPECT_LT(static_cast<std::size_t>(grown_kib) * 1024, budget) << "peak RSS grew by " << grown_kib << " KiB";
  std::printf("consolidate: %.1f MiB output, peak RSS +%.1f MiB (budget %.0f MiB)\n", out_size / 1048576.0,
              grown_kib / 1024.0, budget / 1048576.0);
  auto f = torchfile::TorchFile::open(folder + ".consolidated");
  const Value& a = *f->root()->get("state_dict")->get("a");
  const torchfile::TensorInfo* info = f->tensor_of(a);
  ASSERT_NE(info, nullptr);
  // Element [7, 4095] belongs to rank 3's dim-1 shard.
  float v;
  f->source().read(info->storage.offset + (7 * 4096 + 4095) * 4, std::as_writable_bytes(std::span<float>(&v, 1)), "a");
  EXPECT_EQ(v, 3.0f);
}

std::pair<nlohmann::json, std::uint64_t> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  return {nlohmann::json::parse(header), 8 + n};
}

TEST(ConsolidateTest, SafetensorsSingleFile) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 3);
  write_meta_pt(folder);
  auto o = options_for(folder, dir.file("model.safetensors"));
  o.format = ConsolidateFormat::kSafetensors;
  consolidate(o);
  auto [header, data_start] = read_safetensors_header(dir.file("model.safetensors"));
  EXPECT_EQ(data_start % 8, 0u);
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["w"]["dtype"], "F32");
  EXPECT_EQ(header["v"]["dtype"], "BF16");
  EXPECT_EQ(header["scalar"]["shape"], nlohmann::json::array());
  EXPECT_FALSE(header.contains("exp_avg"));
  std::uint64_t begin = header["c"]["data_offsets"][0], end = header["c"]["data_offsets"][1];
  std::ifstream in(dir.file("model.safetensors"), std::ios::binary);
  std::vector<std::byte> got(end - begin);
  in.seekg(static_cast<std::streamoff>(data_start + begin));
  in.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size()));
  EXPECT_EQ(got, expected_bytes("model.c"));
}

TEST(ConsolidateTest, SafetensorsShardedFolder) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 2);
  write_meta_pt(folder);
  auto o = options_for(folder, dir.file("hf"));
  o.format = ConsolidateFormat::kSafetensors;
  o.max_shard_bytes = 130;  // sorted: [c 112 B] [rep 40 B, scalar 4 B, v 14 B] [w 120 B]
  consolidate(o);
  std::ifstream in(dir.file("hf/model.safetensors.index.json"));
  nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["weight_map"]["c"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["v"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["w"], "model-00003-of-00003.safetensors");
  std::uint64_t total = index["metadata"]["total_size"];
  EXPECT_EQ(total, 120u + 14 + 112 + 40 + 4);
  EXPECT_TRUE(fs::exists(dir.file("hf/model-00003-of-00003.safetensors")));
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.path()))
    n += e.path().filename() != "ckpt" && e.path().filename() != "hf";
  EXPECT_EQ(n, 0u);
}

TEST(ConsolidateTest, HfSafetensorsIsAlwaysTheFolderAndReadsBackAsACheckpoint) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_state(folder, 2);
  write_meta_pt(folder);
  auto o = options_for(folder, dir.file("hf"));
  o.format = ConsolidateFormat::kHfSafetensors;
  consolidate(o);
  std::ifstream in(dir.file("hf/model.safetensors.index.json"));
  const nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["weight_map"]["c"], "model-00001-of-00001.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 120u + 14 + 112 + 40 + 4);
  // The export is a Hugging Face folder shardpoint reads like any checkpoint.
  auto out = storage::open_storage(dir.file("hf"));
  CheckpointReader reader(*out);
  EXPECT_TRUE(reader.raw_tensor_items());
  const auto& c = reader.tensor("c");
  std::vector<std::byte> got(static_cast<std::size_t>(volume(c.size)) * dtype_itemsize(c.properties.dtype));
  reader.read_box("c", Shape(c.size.size(), 0), c.size, got);
  EXPECT_EQ(got, expected_bytes("model.c"));
}

TEST(SafetensorsWriterTest, HeaderAndPadding) {
  StringSink sink;
  format::SafetensorsWriter w(sink, {{"a\"b", DType::kFloat16, {2}}, {"z", DType::kBool, {}}});
  std::byte data[5] = {};
  w.write(std::span<const std::byte>(data, 2));
  w.write(std::span<const std::byte>(data, 3));
  w.finish();
  const std::string& s = sink.str();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(s.size(), 8 + n + 5);
  EXPECT_THROW(w.write(std::span<const std::byte>(data, 1)), UsageError);
  auto header = nlohmann::json::parse(s.substr(8, n));
  EXPECT_EQ(header["a\"b"]["data_offsets"], nlohmann::json({0, 4}));
  EXPECT_EQ(header["z"]["data_offsets"], nlohmann::json({4, 5}));
  EXPECT_THROW(format::safetensors_header({{"c", DType::kComplex64, {1}}}), UsageError);
}

}  // namespace
}  // namespace shardpoint::engine
