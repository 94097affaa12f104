// Lightning's consolidated layout as dict edits: dict.update order, state_dict rename,
// optimizer_states gathering and the KeyError cases; which strategy's layout a .metadata has.
#include "engine/lightning_layout.h"

#include <gtest/gtest.h>

#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using pickle::Value;

std::vector<std::string> keys(const pickle::DictEntries& entries) {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries) out.push_back(k->as_string());
  return out;
}

pickle::DictEntries dict_of(const std::vector<std::string>& names) {
  pickle::DictEntries e;
  for (const auto& n : names) e.emplace_back(Value::str(n), Value::str("v:" + n));
  return e;
}

TEST(LightningLayoutTest, MergeIsDictUpdate) {
  pickle::DictEntries entries = dict_of({"model", "optimizer_0"});
  merge_dict_update(entries, *Value::dict(dict_of({"epoch", "model"})));
  EXPECT_EQ(keys(entries), (std::vector<std::string>{"model", "optimizer_0", "epoch"}));
  EXPECT_EQ(entries[0].second->as_string(), "v:model");
}

TEST(LightningLayoutTest, TrainerLayoutRenamesAndGathers) {
  pickle::DictEntries entries = dict_of({"optimizer_1", "model", "epoch", "optimizer_0", "optimizer_x"});
  apply_trainer_layout(entries, LightningLayout::kFsdp);
  EXPECT_EQ(keys(entries), (std::vector<std::string>{"epoch", "optimizer_x", "state_dict", "optimizer_states"}));
  const auto& states = entries[3].second->items();
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0]->as_string(), "v:optimizer_0");
  EXPECT_EQ(states[1]->as_string(), "v:optimizer_1");
}

TEST(LightningLayoutTest, MissingModelOrOptimizerIndexIsPlanError) {
  pickle::DictEntries no_model = dict_of({"epoch"});
  EXPECT_THROW(apply_trainer_layout(no_model, LightningLayout::kFsdp), PlanError);
  pickle::DictEntries gap = dict_of({"model", "optimizer_0", "optimizer_2"});
  EXPECT_THROW(apply_trainer_layout(gap, LightningLayout::kFsdp), PlanError);
  pickle::DictEntries no_state_dict = dict_of({"model", "epoch"});
  try {
    apply_trainer_layout(no_state_dict, LightningLayout::kModelParallel);
    FAIL() << "expected PlanError";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("no \"state_dict\" key"), std::string::npos) << e.what();
  }
}

// ModelParallelStrategy saves the module state under "state_dict": it moves to the end, as
// "model" does, and the optimizers are gathered the same way.
TEST(LightningLayoutTest, ModelParallelLayoutKeepsStateDictAndGathers) {
  pickle::DictEntries entries = dict_of({"state_dict", "optimizer_0", "epoch", "global_step"});
  apply_trainer_layout(entries, LightningLayout::kModelParallel);
  EXPECT_EQ(keys(entries), (std::vector<std::string>{"epoch", "global_step", "state_dict", "optimizer_states"}));
  EXPECT_EQ(entries[2].second->as_string(), "v:state_dict");
  ASSERT_EQ(entries[3].second->items().size(), 1u);
  EXPECT_EQ(entries[3].second->items()[0]->as_string(), "v:optimizer_0");
}

format::Metadata metadata_with(const std::vector<format::ObjectPath>& paths) {
  format::Metadata md;
  int i = 0;
  for (const format::ObjectPath& path : paths) {
    const std::string fqn = "item" + std::to_string(i++);
    md.state_dict_metadata.emplace(fqn, format::BytesStorageMetadata{});
    md.planner_data.emplace(fqn, path);
  }
  return md;
}

TEST(LightningLayoutTest, LayoutIsToldByTheModelKey) {
  using P = format::ObjectPath;
  EXPECT_EQ(lightning_layout_of(metadata_with({P{"optimizer_0", "state", "w"}, P{"model", "w"}})),
            LightningLayout::kFsdp);
  EXPECT_EQ(lightning_layout_of(metadata_with({P{"state_dict", "w"}, P{"optimizer_0", "param_groups", 0, "lr"}})),
            LightningLayout::kModelParallel);
  // Both keys: "model" wins, as in Lightning's _format_checkpoint.
  EXPECT_EQ(lightning_layout_of(metadata_with({P{"state_dict", "w"}, P{"model", "w"}})), LightningLayout::kFsdp);
  EXPECT_EQ(lightning_layout_of(metadata_with({P{"optim", "w"}, P{std::int64_t{0}}})), std::nullopt);
  EXPECT_THROW(require_lightning_layout(metadata_with({P{"optim", "w"}})), PlanError);
  EXPECT_STREQ(model_key(LightningLayout::kModelParallel), "state_dict");
  EXPECT_STREQ(model_key(LightningLayout::kFsdp), "model");
}

}  // namespace
}  // namespace shardpoint::engine
