#include "engine/lightning_layout.h"

#include <cstddef>
#include <string_view>
#include <variant>
#include <vector>

#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Index of the str key `key` in a dict's entries, or -1.
std::ptrdiff_t find_key(const pickle::DictEntries& entries, const std::string& key) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ValuePtr& k = entries[i].first;
    if (k && k->is(Kind::kStr) && k->as_string() == key) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

// checkpoint[key] = value (in place when present, appended otherwise).
void assign_key(pickle::DictEntries& entries, const std::string& key, ValuePtr value) {
  std::ptrdiff_t i = find_key(entries, key);
  if (i >= 0) {
    entries[static_cast<std::size_t>(i)].second = std::move(value);
  } else {
    entries.emplace_back(Value::str(key), std::move(value));
  }
}

ValuePtr pop_key(pickle::DictEntries& entries, const std::string& key) {
  std::ptrdiff_t i = find_key(entries, key);
  if (i < 0) return nullptr;
  ValuePtr v = entries[static_cast<std::size_t>(i)].second;
  entries.erase(entries.begin() + i);
  return v;
}

// re.match("optimizer_[0-9]+", key): a prefix match.
bool matches_optimizer_prefix(const std::string& key) {
  constexpr std::string_view kPrefix = "optimizer_";
  return key.size() > kPrefix.size() && key.compare(0, kPrefix.size(), kPrefix) == 0 && key[kPrefix.size()] >= '0' &&
         key[kPrefix.size()] <= '9';
}

}  // namespace

void merge_dict_update(pickle::DictEntries& entries, const pickle::Value& other) {
  for (const auto& [k, v] : other.entries()) {
    if (k && k->is(Kind::kStr)) {
      assign_key(entries, k->as_string(), v);
    } else {
      entries.emplace_back(k, v);
    }
  }
}

const char* model_key(LightningLayout layout) {
  switch (layout) {
    case LightningLayout::kFsdp: return "model";
    case LightningLayout::kModelParallel: return "state_dict";
  }
  return "model";
}

std::optional<LightningLayout> lightning_layout_of(const format::Metadata& md) {
  bool state_dict = false;
  for (const auto& [fqn, _] : md.state_dict_metadata) {
    auto it = md.planner_data.find(fqn);
    std::string first = fqn;
    if (it != md.planner_data.end() && !it->second.empty()) {
      const auto* s = std::get_if<std::string>(&it->second.front());
      if (s == nullptr) continue;
      first = *s;
    }
    if (first == "model") return LightningLayout::kFsdp;
    state_dict |= first == "state_dict";
  }
  if (state_dict) return LightningLayout::kModelParallel;
  return std::nullopt;
}

LightningLayout require_lightning_layout(const format::Metadata& md) {
  if (std::optional<LightningLayout> layout = lightning_layout_of(md)) return *layout;
  throw PlanError(
      "the checkpoint has neither a \"model\" key (Lightning's FSDPStrategy) nor a \"state_dict\" key "
      "(ModelParallelStrategy), one of which Lightning's Trainer consolidation makes \"state_dict\" (Lightning "
      "raises KeyError: 'model'); use --layout fabric to keep the keys as saved");
}

void apply_trainer_layout(pickle::DictEntries& entries, LightningLayout layout) {
  const std::string key = model_key(layout);
  ValuePtr model = pop_key(entries, key);
  if (!model) {
    throw PlanError("the checkpoint has no \"" + key +
                    "\" key, which Lightning's Trainer consolidation makes \"state_dict\" (Lightning raises "
                    "KeyError: '" +
                    key + "'); use --layout fabric to keep the keys as saved");
  }
  assign_key(entries, "state_dict", std::move(model));
  std::size_t n = 0;
  for (const auto& [k, v] : entries) {
    if (k && k->is(Kind::kStr) && matches_optimizer_prefix(k->as_string())) ++n;
  }
  if (n == 0) return;
  std::vector<ValuePtr> states;
  for (std::size_t i = 0; i < n; ++i) {
    std::string key = "optimizer_" + std::to_string(i);
    ValuePtr v = pop_key(entries, key);
    if (!v) {
      throw PlanError("the checkpoint has " + std::to_string(n) + " keys matching optimizer_[0-9]+ but no \"" + key +
                      "\" (Lightning raises KeyError: '" + key + "')");
    }
    states.push_back(std::move(v));
  }
  assign_key(entries, "optimizer_states", Value::list(std::move(states)));
}

}  // namespace shardpoint::engine
