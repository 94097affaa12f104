// The demo model's state-dict layout, the WikiText-2 reader, the data schedule, and
// FSDPStrategy + sharded optimizers on in-process ranks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "comm/thread_communicator.h"
#include "core/error.h"
#include "train/data.h"
#include "train/fsdp_strategy.h"
#include "train/model.h"
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
  EXPECT_EQ(FSDPStrategy().state_dict_type(), "full");
  EXPECT_EQ(FSDPStrategy("sharded").state_dict_type(), "sharded");
  try {
    FSDPStrategy bad("local");
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
    FSDPStrategy s("sharded");
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
    EXPECT_FALSE(at::equal(one[0], init_params([] { auto c = model_config("tiny"); c.vocab_size = TextCorpus::load(SP_TINY_DATA).vocab_size(); return c; }(), 3)[0]));
  }
}

// Params and Adam state (full tensors, rank 0's view) after Trainer::fit on `world` ranks.
struct Trained {
  std::vector<at::Tensor> tensors;
  std::string checkpoint;
  std::int64_t start_step = 0;
};

Trained fit_on(int world, const std::string& type, std::int64_t max_steps, const std::string& root,
               const std::string& ckpt) {
  at::set_num_threads(1);
  const TextCorpus data = TextCorpus::load(SP_TINY_DATA);
  ModelConfig cfg = model_config("tiny");
  cfg.vocab_size = data.vocab_size();
  Trained out;
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(60)});
  group.run([&](comm::Communicator& comm) {
    TrainerOptions o;
    o.max_steps = max_steps;
    o.default_root_dir = root;
    o.seed = 11;
    o.global_batch = 3;
    o.optimizer = optimizer_config("adam", 1e-3);
    o.progress = false;
    Trainer t(o, FSDPStrategy(type));
    const FitResult r = t.fit(comm, cfg, data, ckpt);
    std::vector<at::Tensor> all = t.strategy().full_params();
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      std::vector<at::Tensor> pieces;
      for (const auto& n : t.strategy().names()) pieces.push_back(t.optimizer().state()[n][key]);
      for (auto& x : t.strategy().all_gather(pieces)) all.push_back(x);
    }
    all.push_back(t.optimizer().state()[t.strategy().names()[0]]["step"]);
    if (comm.rank() == 0) out = {all, r.checkpoint_path, r.start_step};
  });
  return out;
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
    ASSERT_EQ(resumed.tensors.size(), straight.tensors.size());
    for (std::size_t i = 0; i < straight.tensors.size(); ++i) {
      EXPECT_TRUE(at::equal(straight.tensors[i], resumed.tensors[i])) << first << " -> " << second << " tensor " << i;
    }
  }
  // The same sharded checkpoint on 3 ranks: it loads (resharded) and training goes on.
  const Trained half = fit_on(2, "sharded", 2, root, "");
  const Trained three = fit_on(3, "sharded", 3, root, half.checkpoint);
  EXPECT_EQ(three.start_step, 2);
  EXPECT_EQ(three.tensors.back().item<float>(), 3.0f);  // Adam's step
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace shardpoint::train
