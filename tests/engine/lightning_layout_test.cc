// Lightning's consolidated layout as dict edits: dict.update order, state_dict rename,
// optimizer_states gathering and the KeyError cases.
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
  apply_trainer_layout(entries);
  EXPECT_EQ(keys(entries), (std::vector<std::string>{"epoch", "optimizer_x", "state_dict", "optimizer_states"}));
  const auto& states = entries[3].second->items();
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0]->as_string(), "v:optimizer_0");
  EXPECT_EQ(states[1]->as_string(), "v:optimizer_1");
}

TEST(LightningLayoutTest, MissingModelOrOptimizerIndexIsPlanError) {
  pickle::DictEntries no_model = dict_of({"epoch"});
  EXPECT_THROW(apply_trainer_layout(no_model), PlanError);
  pickle::DictEntries gap = dict_of({"model", "optimizer_0", "optimizer_2"});
  EXPECT_THROW(apply_trainer_layout(gap), PlanError);
}

}  // namespace
}  // namespace shardpoint::engine
