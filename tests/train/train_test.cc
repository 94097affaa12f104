// The demo model's state-dict layout, the WikiText-2 reader, the data schedule, and
// FSDPStrategy + sharded optimizers on in-process ranks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_files.h"
#include "shardpoint/error.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/s3_servers.h"
#include "torchfile/torch_file.h"
#include "train/data.h"
#include "train/fsdp_strategy.h"
#include "train/lightning_checkpoint.h"
#include "train/model.h"
#include "train/model_checkpoint.h"
#include "train/sharded_optimizer.h"
#include "train/trainer.h"

namespace shardpoint::train {
namespace {

TEST(ModelTest, DemoStateDictMatchesLightning) {
  const auto specs = param_specs(model_config("demo"));
  ASSERT_EQ(specs.size(), 67u);
  std::int64_t total = 0;
  for (const auto& s : specs) {
    std::int64_t n = 1;
    for (auto d : s.shape) n *= d;
    total += n;
  }
  EXPECT_EQ(total, 14635678);
  EXPECT_EQ(specs.front().name, "model.embedding.weight");
  EXPECT_EQ(specs.front().shape, (Shape{33278, 200}));
  EXPECT_EQ(specs[1].name, "model.transformer.encoder.layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(specs[1].shape, (Shape{600, 200}));
  EXPECT_EQ(specs[12].name, "model.transformer.encoder.layers.0.norm2.bias");
  EXPECT_EQ(specs[25].name, "model.transformer.encoder.norm.weight");
  EXPECT_EQ(specs[27].name, "model.transformer.decoder.layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(specs[31].name, "model.transformer.decoder.layers.0.multihead_attn.in_proj_weight");
  EXPECT_EQ(specs[63].name, "model.transformer.decoder.norm.weight");
  EXPECT_EQ(specs[65].name, "model.decoder.weight");
  EXPECT_EQ(specs[66].name, "model.decoder.bias");
  EXPECT_EQ(specs[66].shape, (Shape{33278}));
  EXPECT_THROW(model_config("huge"), UsageError);
}

TEST(ModelTest, NoFutureTokenLeaks) {
  ModelConfig cfg = model_config("tiny");
  cfg.vocab_size = 50;
  const auto params = init_params(cfg, 1);
  at::Generator gen = at::detail::createCPUGenerator(5);
  // Positions >= 20 are ignored (nll_loss's ignore_index -100); changing input 20 or later
  // must not change the loss of positions < 20 (the demo's unmasked encoder would leak).
  at::Tensor in = at::arange(35, at::kLong).remainder(50).view({1, 35});
  at::Tensor tg = (at::arange(35, at::kLong) + 1).remainder(50).view({1, 35});
  tg.narrow(1, 20, 15).fill_(-100);
  at::Tensor changed = in.clone();
  changed.narrow(1, 20, 15).fill_(3);
  const double a = loss_sum(cfg, params, in, tg, false, gen).item<double>();
  const double b = loss_sum(cfg, params, changed, tg, false, gen).item<double>();
  EXPECT_EQ(a, b);
  changed.narrow(1, 19, 1).fill_(3);  // an earlier input does matter
  EXPECT_NE(a, loss_sum(cfg, params, changed, tg, false, gen).item<double>());
}

TEST(DataTest, WikiTextRules) {
  std::string many;
  for (int i = 0; i < 70; ++i) many += "x ";
  const TextCorpus c = TextCorpus::from_text(" = A = \n\n b a c\n" + many + "\n");
  EXPECT_EQ(c.words()[0], "=");
  EXPECT_EQ(c.words()[1], "A");
  EXPECT_EQ(c.words()[2], "<eos>");
  EXPECT_EQ(c.tokens().size(), 4u + 1 + 4 + 71);  // "= A = <eos>", "<eos>", "b a c <eos>", "x x ... <eos>"
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.vocab_size(), 7);
  EXPECT_THROW(TextCorpus::from_text("a b c"), UsageError);
  const TextCorpus tiny = TextCorpus::load(SP_TINY_DATA);
  EXPECT_GT(tiny.size(), 100);
  std::vector<std::int64_t> in, tg;
  tiny.item(2, in, tg);
  EXPECT_EQ(in.size(), 35u);
  EXPECT_EQ(in[1], tg[0]);
  EXPECT_EQ(rank_items(2, 4, 1, 2, 100), (std::vector<std::int64_t>{9, 11}));
  EXPECT_EQ(rank_items(0, 4, 2, 3, 100), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(rank_items(30, 4, 0, 1, 100), (std::vector<std::int64_t>{20, 21, 22, 23}));
  EXPECT_EQ(rank_items(3, 3, 0, 1, 10), (std::vector<std::int64_t>{9, 0, 1}));  // an epoch's last batch wraps
  EXPECT_EQ(rank_items(4, 3, 0, 1, 10), (std::vector<std::int64_t>{0, 1, 2}));  // the next epoch starts over
}

TEST(DataTest, ScheduleEpochsAndAccumulation) {
  // 10 items, batches of 3: 4 batches an epoch; 3 batches a step: steps of 3 and 1 batches.
  const DataSchedule s{10, 3, 3};
  EXPECT_EQ(s.batches_per_epoch(), 4);
  EXPECT_EQ(s.steps_per_epoch(), 2);
  EXPECT_EQ(s.epoch_of_step(1), 0);
  EXPECT_EQ(s.epoch_of_step(2), 1);
  EXPECT_EQ(s.batches_before(1), 3);
  EXPECT_EQ(s.batches_before(2), 4);
  EXPECT_EQ(s.batches_before(3), 7);
  EXPECT_EQ(s.batches_in_step(0), 3);
  EXPECT_EQ(s.batches_in_step(1), 1);  // the epoch's remainder (Lightning steps at epoch end)
  EXPECT_EQ(s.item(3, 1), 0);
  EXPECT_EQ(s.item(4, 0), 0);
  const DataSchedule one{10, 4, 1};
  EXPECT_EQ(one.steps_per_epoch(), 3);
  EXPECT_EQ(one.batches_before(5), 5);
}

TEST(FSDPStrategyTest, StateDictTypeIsFullOrSharded) {
  EXPECT_EQ(FSDPStrategy().state_dict_type(), StateDictType::kFull);
  EXPECT_EQ(FSDPStrategy(StateDictType::kSharded).state_dict_type(), StateDictType::kSharded);
  for (StateDictType t : {StateDictType::kFull, StateDictType::kSharded}) {
    EXPECT_EQ(parse_state_dict_type(state_dict_type_name(t)), t);
  }
  EXPECT_EQ(state_dict_type_name(StateDictType::kFull), "full");
  EXPECT_EQ(state_dict_type_name(StateDictType::kSharded), "sharded");
  try {
    parse_state_dict_type("local");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"full\" or \"sharded\""), std::string::npos) << e.what();
  }
}

// Full parameters after `steps` steps on `world` in-process ranks.
std::vector<at::Tensor> train_on(int world, const std::string& opt, int steps) {
  at::set_num_threads(1);
  const TextCorpus data = TextCorpus::load(SP_TINY_DATA);
  ModelConfig cfg = model_config("tiny");
  cfg.vocab_size = data.vocab_size();
  std::vector<at::Tensor> out;
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(60)});
  group.run([&](comm::Communicator& comm) {
    FSDPStrategy s(StateDictType::kSharded);
    s.setup(comm, param_specs(cfg), init_params(cfg, 3));
    OptimizerConfig oc = optimizer_config(opt, opt == "sgd" ? 0.1 : 1e-3);
    if (opt == "sgd") oc.momentum = 0.9;
    ShardedOptimizer o(oc, s.names());
    for (int i = 0; i < steps; ++i) run_step(s, o, cfg, data, DataSchedule{data.size(), 3, 1}, i, 7);
    auto full = s.full_params();
    if (comm.rank() == 0) out = full;
  });
  return out;
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(a[i].abs().max().item<double>(), 1e-12);
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), rel * scale) << "tensor " << i;
  }
}

TEST(FSDPStrategyTest, ShardedTrainingDoesNotDependOnWorldSize) {
  // Adam/AdamW are checked for bitwise repeatability only: they scale each gradient element
  // to about +-lr, so elements whose exact gradient is 0 (e.g. the attention key bias, which
  // softmax ignores) turn reduction-order roundoff into full-size updates.
  for (const std::string opt : {"sgd", "adamw"}) {
    const auto one = train_on(1, opt, 2);
    const auto three = train_on(3, opt, 2);
    if (opt == "sgd") expect_close(one, three, 1e-5);
    const auto again = train_on(3, opt, 2);
    for (std::size_t i = 0; i < three.size(); ++i) EXPECT_TRUE(at::equal(three[i], again[i])) << opt << " " << i;
    EXPECT_FALSE(at::equal(one[0], init_params(
                                       [] {
                                         auto c = model_config("tiny");
                                         c.vocab_size = TextCorpus::load(SP_TINY_DATA).vocab_size();
                                         return c;
                                       }(),
                                       3)[0]));
  }
}

// Params and Adam state (full tensors, rank 0's view) after Trainer::fit on `world` ranks.
struct Trained {
  std::vector<at::Tensor> tensors;
  std::string checkpoint;
  std::int64_t start_step = 0;
  FitResult result;
};

using Tweak = std::function<void(TrainerOptions&)>;

Trained fit_on(int world, const std::string& type, std::int64_t max_steps, const std::string& root,
               const std::string& ckpt, const Tweak& tweak = {}, const TextCorpus* corpus = nullptr) {
  at::set_num_threads(1);
  static const TextCorpus tiny = TextCorpus::load(SP_TINY_DATA);
  const TextCorpus& data = corpus ? *corpus : tiny;
  ModelConfig cfg = model_config("tiny");
  cfg.vocab_size = data.vocab_size();
  Trained out;
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(60)});
  group.run([&](comm::Communicator& comm) {
    TrainerOptions o;
    o.max_steps = max_steps;
    o.default_root_dir = Location::parse(root);
    o.seed = 11;
    o.global_batch = 3;
    o.optimizer = optimizer_config("adam", 1e-3);
    o.progress = false;
    if (tweak) tweak(o);
    Trainer t(o, FSDPStrategy(parse_state_dict_type(type)));
    const FitResult r = t.fit(comm, cfg, data, ckpt);
    std::vector<at::Tensor> all = t.strategy().full_params();
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      std::vector<at::Tensor> pieces;
      for (const auto& n : t.strategy().names()) pieces.push_back(t.optimizer().state()[n][key]);
      for (auto& x : t.strategy().all_gather(pieces)) all.push_back(x);
    }
    all.push_back(t.optimizer().state()[t.strategy().names()[0]]["step"]);
    if (comm.rank() == 0) out = {all, r.checkpoint_path, r.start_step, r};
  });
  return out;
}

void expect_equal(const Trained& want, const Trained& got, const std::string& what) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (std::size_t i = 0; i < want.tensors.size(); ++i) {
    EXPECT_TRUE(at::equal(want.tensors[i], got.tensors[i])) << what << " tensor " << i;
  }
}

TEST(TrainerTest, AdamResumeIsBitwiseThroughFullAndShardedCheckpoints) {
  const std::string root = ::testing::TempDir() + "sp_trainer_test_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  const Trained straight = fit_on(2, "full", 4, root, "");
  for (const std::string first : {"sharded", "full"}) {
    const Trained half = fit_on(2, first, 2, root, "");
    EXPECT_EQ(std::filesystem::is_directory(half.checkpoint), first == "sharded") << half.checkpoint;
    const std::string second = first == "sharded" ? "full" : "sharded";
    const Trained resumed = fit_on(2, second, 4, root, half.checkpoint);
    EXPECT_EQ(resumed.start_step, 2);
    expect_equal(straight, resumed, first + " -> " + second);
  }
  // The same sharded checkpoint on 3 ranks: it loads (resharded) and training goes on.
  const Trained half = fit_on(2, "sharded", 2, root, "");
  const Trained three = fit_on(3, "sharded", 3, root, half.checkpoint);
  EXPECT_EQ(three.start_step, 2);
  EXPECT_EQ(three.tensors.back().item<float>(), 3.0f);  // Adam's step
  std::filesystem::remove_all(root);
}

// Flips one byte of the file at `at`.
void flip_byte(const std::string& path, std::uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get() ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(c);
}

// Resuming checks the zip CRC-32 of the torch.save records it reads: a full checkpoint's
// tensors, a sharded checkpoint's meta.pt. A flipped byte fails the resume naming the file
// and the record.
TEST(TrainerTest, ResumeChecksTheZipCrcOfWhatItReads) {
  const std::string root = ::testing::TempDir() + "sp_trainer_crc_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  auto expect_crc_error = [&](const std::string& type, const std::string& ckpt, const std::string& file,
                              const std::string& record) {
    try {
      fit_on(1, type, 3, root, ckpt);
      ADD_FAILURE() << "resumed from a damaged " << ckpt;
    } catch (const FormatError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(file, 0), 0u) << m;
      EXPECT_NE(m.find("zip record \"" + record + "\""), std::string::npos) << m;
      EXPECT_NE(m.find("CRC-32 mismatch"), std::string::npos) << m;
    }
  };
  const Trained full = fit_on(1, "full", 2, root, "");
  {
    // The storage of the first parameter (data/0 may hold callback state resuming skips).
    auto file = torchfile::TorchFile::open(full.checkpoint);
    const torchfile::TensorInfo* param = file->tensor_of(*file->root()->get("state_dict")->entries().front().second);
    ASSERT_NE(param, nullptr);
    const torchfile::ZipEntry& record = *file->record("data/" + param->storage_key);
    flip_byte(full.checkpoint, record.data_offset + record.uncompressed_size / 2);
    expect_crc_error("full", full.checkpoint, full.checkpoint + ": tensor \"", record.name);
  }
  const Trained sharded = fit_on(1, "sharded", 2, root, "");
  {
    const std::string meta = sharded.checkpoint + "/meta.pt";
    auto file = torchfile::TorchFile::open(meta);
    const torchfile::ZipEntry& record = *file->record("data.pkl");
    flip_byte(meta, record.data_offset + record.uncompressed_size / 2);
    expect_crc_error("sharded", sharded.checkpoint, meta, record.name);
  }
  std::filesystem::remove_all(root);
}

TEST(TrainerTest, AccumulationAndClippingKeepResumeBitwise) {
  // 2 batches of 3 items per step, gradient norm clipped to 0.05 (the tiny model's norm is
  // larger, so clipping acts): 4 straight steps equal 2 + 2 through either checkpoint format.
  const std::string root = ::testing::TempDir() + "sp_trainer_accum_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  const Tweak tweak = [](TrainerOptions& o) {
    o.accumulate_grad_batches = 2;
    o.gradient_clip_val = 0.05;
  };
  const Trained straight = fit_on(2, "full", 4, root, "", tweak);
  const Trained unclipped = fit_on(2, "full", 4, root, "", [](TrainerOptions& o) { o.accumulate_grad_batches = 2; });
  EXPECT_FALSE(at::equal(straight.tensors[0], unclipped.tensors[0]));  // clipping changed the update
  for (const std::string type : {"sharded", "full"}) {
    const Trained half = fit_on(2, type, 2, root, "", tweak);
    // The checkpoint records accumulation; the resumed run takes it from there.
    const Trained resumed = fit_on(2, type == "sharded" ? "full" : "sharded", 4, root, half.checkpoint,
                                   [](TrainerOptions& o) { o.gradient_clip_val = 0.05; });
    EXPECT_EQ(resumed.start_step, 2);
    expect_equal(straight, resumed, type);
  }
  std::filesystem::remove_all(root);
}

// 13 items of 35 tokens: batches of 3 -> 5 batches an epoch; 2 batches a step -> 3 steps
// an epoch (2, 2, 1 batches).
TextCorpus thirteen_items() {
  std::string text;  // one line: 489 words + "<eos>" = 490 tokens = 14 blocks
  for (int i = 0; i < 14 * 35 - 1; ++i) text += "w" + std::to_string(i % 17) + " ";
  return TextCorpus::from_text(text);
}

TEST(TrainerTest, MaxEpochsEndsAtEpochBoundariesAndResumesAcrossThem) {
  const TextCorpus data = thirteen_items();
  ASSERT_EQ(DataSchedule({data.size(), 3, 2}).steps_per_epoch(), 3) << data.size();
  const std::string root = ::testing::TempDir() + "sp_trainer_epochs_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  auto epochs = [](std::int64_t n) {
    return [n](TrainerOptions& o) {
      o.max_steps = -1;
      o.max_epochs = n;
      o.accumulate_grad_batches = 2;
    };
  };
  const Trained straight = fit_on(2, "sharded", -1, root, "", epochs(2), &data);
  // One checkpoint per epoch end; save_top_k 1 keeps the newest.
  const std::string dir = std::filesystem::path(straight.checkpoint).parent_path().string();
  ASSERT_EQ(straight.result.saved.size(), 2u);
  EXPECT_EQ(straight.result.saved[0], dir + "/epoch=0-step=3.ckpt");
  EXPECT_EQ(straight.result.saved[1], dir + "/epoch=1-step=6.ckpt");
  EXPECT_FALSE(std::filesystem::exists(straight.result.saved[0]));
  EXPECT_EQ(straight.result.losses.size(), 6u);
  const Trained first = fit_on(2, "sharded", -1, root, "", epochs(1), &data);
  EXPECT_EQ(std::filesystem::path(first.checkpoint).filename(), "epoch=0-step=3.ckpt");
  const Trained second = fit_on(2, "sharded", -1, root, first.checkpoint, epochs(2), &data);
  EXPECT_EQ(second.start_step, 3);
  EXPECT_EQ(std::filesystem::path(second.checkpoint).filename(), "epoch=1-step=6.ckpt");
  expect_equal(straight, second, "epoch 1 resumed");
  // max_steps stops inside an epoch; the epoch-end hook still saves (Lightning's max_steps rule).
  const Trained stopped = fit_on(
      1, "full", 4, root, "",
      [&](TrainerOptions& o) {
        epochs(5)(o);
        o.max_steps = 4;
      },
      &data);
  EXPECT_EQ(std::filesystem::path(stopped.checkpoint).filename(), "epoch=1-step=4.ckpt");
  std::filesystem::remove_all(root);
}

std::string text_of(const std::optional<Location>& path) { return path ? path->to_string() : ""; }

// What ckpt_path="last" resumes from under root, as text ("" for none).
std::string last_path(const std::string& root) { return text_of(resolve_last_checkpoint(Location::parse(root)).path); }

TEST(TrainerTest, ObjectStoreRootAndResumeFromLast) {
  // s3:// on moto (signatures checked): the object-store code path of s3://, gs://, az://.
  SP_REQUIRE_MOTO(moto);
  const std::string root = "s3://sp-test/trainer-last-" + std::to_string(::getpid());
  const Tweak last = [](TrainerOptions& o) {
    o.checkpoint.save_last = true;
    o.checkpoint.every_n_train_steps = 1;
  };
  const Trained straight = fit_on(2, "sharded", 4, root, "", last);
  const Trained half = fit_on(2, "sharded", 2, root, "", last);
  EXPECT_EQ(half.checkpoint, root + "/lightning_logs/version_1/checkpoints/last.ckpt");
  auto st = storage::open_storage(root);
  // every_n_train_steps 1, top-k 1: only the newest step checkpoint and last.ckpt remain.
  std::set<std::string> folders;
  for (const auto& o : st->list("lightning_logs/version_1/")) folders.insert(o.key.substr(0, o.key.rfind('/')));
  EXPECT_EQ(folders, (std::set<std::string>{"lightning_logs/version_1/checkpoints/epoch=0-step=2.ckpt",
                                            "lightning_logs/version_1/checkpoints/last.ckpt"}));
  // A newer version whose last.ckpt never got its commit marker is not "last".
  const std::string metadata = "lightning_logs/version_1/checkpoints/last.ckpt/.metadata";
  std::vector<std::byte> bytes(st->stat(metadata));
  st->read(metadata, 0, bytes);
  st->write_atomic("lightning_logs/version_7/checkpoints/last.ckpt/.metadata", bytes);
  EXPECT_EQ(last_path(root), half.checkpoint);
  const Trained resumed = fit_on(2, "full", 4, root, "last", last);
  EXPECT_EQ(resumed.result.resumed_from, half.checkpoint);
  EXPECT_EQ(resumed.start_step, 2);
  expect_equal(straight, resumed, "last");
  EXPECT_EQ(resumed.checkpoint, root + "/lightning_logs/version_8/checkpoints/last.ckpt");
  EXPECT_TRUE(st->try_stat("lightning_logs/version_8/checkpoints/last.ckpt"));  // full: one object
  st->remove_all();
  // Nothing to resume: a warning, training from scratch.
  const Trained fresh = fit_on(1, "full", 1, root, "last");
  EXPECT_EQ(fresh.start_step, 0);
  EXPECT_EQ(fresh.result.resumed_from, "");
  st->remove_all();
  // gs:// (HMAC interoperability on the same server): save, then resume from "last".
  const std::string gs = "gs://sp-gcs/trainer-last-" + std::to_string(::getpid());
  const Trained one = fit_on(2, "sharded", 1, gs, "", last);
  EXPECT_EQ(one.checkpoint, gs + "/lightning_logs/version_0/checkpoints/last.ckpt");
  const Trained two = fit_on(2, "full", 2, gs, "last", last);
  EXPECT_EQ(two.result.resumed_from, one.checkpoint);
  EXPECT_EQ(two.start_step, 1);
  storage::open_storage(gs)->remove_all();
  // Checkpoint names are appended to the root: a URL with "?options" is refused.
  EXPECT_THROW(fit_on(1, "full", 1, root + "?endpoint=http://127.0.0.1:1", ""), UsageError);
}

ModelCheckpointOptions options(const std::function<void(ModelCheckpointOptions&)>& set) {
  ModelCheckpointOptions o;
  set(o);
  return o;
}

// ModelCheckpoint's decisions with recorded I/O.
struct FakeIO {
  std::set<std::string> present;
  std::vector<std::string> log;
  CheckpointActions actions() {
    CheckpointActions io;
    io.exists = [this](const Location& p) { return present.count(p.to_string()) > 0; };
    io.save = [this](const Location& p) {
      present.insert(p.to_string());
      log.push_back("save " + p.name());
    };
    io.remove = [this](const Location& p) {
      present.erase(p.to_string());
      log.push_back("remove " + p.name());
    };
    return io;
  }
};

TEST(ModelCheckpointTest, DefaultsSaveAtEpochEndAndReplaceThePrevious) {
  ModelCheckpoint mc(ModelCheckpointOptions{});
  EXPECT_EQ(mc.state_key(),
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
            "'train_time_interval': None}");
  mc.set_paths(Location::parse("/r/checkpoints"), std::nullopt);
  FakeIO fake;
  const auto io = fake.actions();
  mc.on_train_batch_end({0, 1, 5.0}, io);
  mc.on_train_epoch_end({0, 3, 4.0}, io);
  mc.on_train_epoch_end({0, 3, 4.0}, io);  // the same step twice: saved once
  mc.on_train_epoch_end({1, 6, 3.0}, io);
  EXPECT_EQ(fake.log, (std::vector<std::string>{"save epoch=0-step=3.ckpt", "save epoch=1-step=6.ckpt",
                                                "remove epoch=0-step=3.ckpt"}));
  EXPECT_EQ(mc.best_model_path(), "/r/checkpoints/epoch=1-step=6.ckpt");
  EXPECT_EQ(mc.kth_value(), std::numeric_limits<float>::infinity());
}

TEST(ModelCheckpointTest, EveryNTrainStepsWithSaveLast) {
  ModelCheckpoint mc(options([](ModelCheckpointOptions& o) {
    o.every_n_train_steps = 2;
    o.save_last = true;
  }));
  EXPECT_NE(mc.state_key().find("'every_n_train_steps': 2, 'every_n_epochs': 0"), std::string::npos);
  mc.set_paths(Location::parse("/r/c"), std::nullopt);
  FakeIO fake;
  const auto io = fake.actions();
  for (std::int64_t step = 1; step <= 5; ++step) {
    mc.on_train_batch_end({0, step, 1.0}, io);
    if (step == 5) mc.on_train_epoch_end({0, step, 1.0}, io);  // max_steps: only last.ckpt
  }
  EXPECT_EQ(fake.log,
            (std::vector<std::string>{"save epoch=0-step=2.ckpt", "save last.ckpt", "save epoch=0-step=4.ckpt",
                                      "remove epoch=0-step=2.ckpt", "save last.ckpt", "save last.ckpt"}));
  EXPECT_EQ(mc.last_model_path(), "/r/c/last.ckpt");
}

TEST(ModelCheckpointTest, TopKOnTrainLoss) {
  ModelCheckpoint mc(options([](ModelCheckpointOptions& o) {
    o.every_n_train_steps = 1;
    o.save_top_k = 2;
    o.monitor = "train_loss";
  }));
  EXPECT_NE(mc.state_key().find("{'monitor': 'train_loss', 'mode': 'min'"), std::string::npos);
  mc.set_paths(Location::parse("/r/c"),
               Location::parse("/r/c/epoch=0-step=1.ckpt"));  // resumed from step 1's: never removed
  FakeIO fake;
  fake.present.insert("/r/c/epoch=0-step=2.ckpt");  // taken: the new one gets -v1
  const auto io = fake.actions();
  const double losses[] = {5, 4, 6, 3, std::nan(""), 2};
  for (std::int64_t step = 1; step <= 6; ++step) mc.on_train_batch_end({0, step, losses[step - 1]}, io);
  EXPECT_EQ(fake.log, (std::vector<std::string>{"save epoch=0-step=1.ckpt", "save epoch=0-step=2-v1.ckpt",
                                                "save epoch=0-step=4.ckpt", "save epoch=0-step=6.ckpt",
                                                "remove epoch=0-step=2-v1.ckpt"}));
  EXPECT_EQ(mc.best_model_path(), "/r/c/epoch=0-step=6.ckpt");
  EXPECT_EQ(*mc.best_model_score(), 2.0f);
  EXPECT_EQ(mc.kth_best_model_path(), "/r/c/epoch=0-step=4.ckpt");
  EXPECT_EQ(mc.kth_value(), 3.0f);
  ASSERT_EQ(mc.best_k_models().size(), 2u);
  // -1 keeps everything; a path outside dirpath is never removed.
  ModelCheckpoint all(options([](ModelCheckpointOptions& o) {
    o.save_top_k = -1;
    o.monitor = "train_loss";
    o.mode = "max";
  }));
  all.set_paths(Location::parse("/r/c"), std::nullopt);
  FakeIO kept;
  for (std::int64_t e = 0; e < 3; ++e) all.on_train_epoch_end({e, e + 1, 1.0 * e}, kept.actions());
  EXPECT_EQ(kept.log.size(), 3u);
  EXPECT_EQ(all.best_model_path(), "/r/c/epoch=2-step=3.ckpt");
}

TEST(ModelCheckpointTest, InvalidConfigurationsAreUsageErrors) {
  auto message = [](ModelCheckpointOptions o) -> std::string {
    try {
      ModelCheckpoint mc(o);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  using O = ModelCheckpointOptions;
  EXPECT_NE(message(options([](O& o) { o.save_top_k = 2; })).find("monitor=None) is not a valid configuration"),
            std::string::npos);
  EXPECT_NE(message(options([](O& o) {
              o.every_n_train_steps = 2;
              o.every_n_epochs = 1;
            })).find("mutually exclusive"),
            std::string::npos);
  EXPECT_NE(message(options([](O& o) { o.monitor = "val_loss"; })).find("could not find the monitored key"),
            std::string::npos);
  EXPECT_NE(message(options([](O& o) { o.save_top_k = -2; })).find("save_top_k=-2"), std::string::npos);
  EXPECT_NE(message(options([](O& o) { o.mode = "avg"; })).find("mode"), std::string::npos);
}

// A torch.save file holding {"global_step": step}: what the resolver reads of a meta.pt or
// a full checkpoint.
void write_step_file(const std::filesystem::path& p, std::int64_t step) {
  std::filesystem::create_directories(p.parent_path());
  TorchFileBuilder files;
  std::ofstream(p, std::ios::binary) << files.bytes(
      *pickle::Value::dict({{pickle::Value::str("global_step"), pickle::Value::integer(step)}}));
}

TEST(ResolveLastTest, NewestCommittedCheckpointWithANoteWhenNotTheNewestLast) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / ("sp_resolve_last_" + std::to_string(::getpid()));
  fs::remove_all(root);
  EXPECT_EQ(last_path(root.string()), "");
  auto touch = [](const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
  };
  auto sharded = [&](const fs::path& dir, std::int64_t step) {  // committed
    touch(dir / ".metadata");
    write_step_file(dir / "meta.pt", step);
  };
  const fs::path v1 = root / "lightning_logs/version_1/checkpoints";
  write_step_file(root / "lightning_logs/version_0/checkpoints/last.ckpt", 9);  // full file, older version
  sharded(v1 / "last.ckpt", 3);
  sharded(v1 / "epoch=0-step=2.ckpt", 2);
  touch(v1 / "last-v1.ckpt/.metadata");                                               // no meta.pt
  touch(root / "lightning_logs/version_3/checkpoints/last.ckpt/meta.pt");             // no .metadata
  sharded(root / "lightning_logs/version_3/checkpoints/.last.ckpt.sp-replace-4", 4);  // staging: hidden
  touch(root / "lightning_logs/version_3/checkpoints/last.ckpt.sp-tmp.1.2");          // a temporary file
  LastCheckpoint last = resolve_last_checkpoint(Location::parse(root.string()));
  EXPECT_EQ(text_of(last.path), (v1 / "last.ckpt").string());
  EXPECT_NE(last.note.find("version_3/checkpoints/last.ckpt is not committed"), std::string::npos) << last.note;
  // The same step: a higher -v wins.
  write_step_file(v1 / "last-v1.ckpt/meta.pt", 3);
  EXPECT_EQ(last_path(root.string() + "/"), (v1 / "last-v1.ckpt").string());
  // A top-k checkpoint newer than every last*: its replacement of last died.
  fs::remove_all(root / "lightning_logs/version_3");
  sharded(v1 / "epoch=0-step=4.ckpt", 4);
  last = resolve_last_checkpoint(Location::parse(root.string()));
  EXPECT_EQ(text_of(last.path), (v1 / "epoch=0-step=4.ckpt").string());
  EXPECT_NE(last.note.find("last-v1.ckpt holds global_step 3"), std::string::npos) << last.note;
  // No last* at all: still the newest committed one, never scratch.
  fs::remove_all(v1 / "last.ckpt");
  fs::remove_all(v1 / "last-v1.ckpt");
  fs::remove_all(root / "lightning_logs/version_0");
  last = resolve_last_checkpoint(Location::parse(root.string()));
  EXPECT_EQ(text_of(last.path), (v1 / "epoch=0-step=4.ckpt").string());
  EXPECT_NE(last.note.find("no last*.ckpt"), std::string::npos) << last.note;
  fs::remove_all(root);
}

// The step decides which checkpoint is resumed: a flipped byte in a candidate's data.pkl
// that still parses (another step) is caught by the record's zip CRC-32.
TEST(ResolveLastTest, ADamagedStepIsCaughtByItsZipCrc) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / ("sp_resolve_crc_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt";
  fs::create_directories(ckpt);
  std::ofstream(ckpt / ".metadata") << "x";
  write_step_file(ckpt / "meta.pt", 1234567);  // pickled as BININT: 87 d6 12 00
  EXPECT_EQ(last_path(root.string()), ckpt.string());
  std::string bytes;
  {
    std::ifstream in(ckpt / "meta.pt", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t at = bytes.find(std::string("\x87\xd6\x12\x00", 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '\x88';  // global_step 1234568: parses
  std::ofstream(ckpt / "meta.pt", std::ios::binary | std::ios::trunc) << bytes;
  try {
    resolve_last_checkpoint(Location::parse(root.string()));
    ADD_FAILURE() << "a damaged data.pkl was read";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("meta.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("data.pkl"), std::string::npos) << what;
    EXPECT_NE(what.find("CRC-32 mismatch"), std::string::npos) << what;
  }
  fs::remove_all(root);
}

TEST(ResolveLastTest, StagingLeftoversAreRemoved) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / ("sp_stale_staging_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path dir = root / "lightning_logs/version_0/checkpoints";
  fs::create_directories(dir / ".last.ckpt.sp-replace-3");
  fs::create_directories(dir / "last.ckpt");
  std::ofstream(dir / ".last.ckpt.sp-replace-3/__0_0.distcp") << "x";
  std::ofstream(dir / "epoch=0-step=3.ckpt.sp-tmp.12.0") << "x";
  std::ofstream(dir / "epoch=0-step=2.ckpt") << "x";
  EXPECT_EQ(local_checkpoints_dirs(Location::parse(root.string())),
            std::vector<Location>{Location::parse(dir.string())});
  EXPECT_EQ(staging_path_for(Location::parse((dir / "last.ckpt").string()), 4).to_string(),
            (dir / ".last.ckpt.sp-replace-4").string());
  EXPECT_EQ(engine::remove_stale_staging(Location::parse(dir.string())), 2u);
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"epoch=0-step=2.ckpt", "last.ckpt"}));
  EXPECT_EQ(engine::remove_stale_staging(Location::parse((root / "missing").string())), 0u);
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardpoint::train
