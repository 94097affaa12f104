#include "train/data.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "shardpoint/error.h"

namespace shardpoint::train {

TextCorpus TextCorpus::load(const std::string& dir) {
  const std::string path = dir + "/train.txt";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw StorageError(StorageError::Kind::kNotFound, fmt::format("{}: cannot open the training text", path));
  std::ostringstream s;
  s << in.rdbuf();
  try {
    return from_text(s.str());
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: {}", path, e.what()));
  }
}

TextCorpus TextCorpus::from_text(const std::string& text) {
  TextCorpus c;
  auto add = [&c](const std::string& w) {
    auto [it, inserted] = c.ids_.emplace(w, static_cast<std::int64_t>(c.words_.size()));
    if (inserted) c.words_.push_back(w);
    c.tokens_.push_back(it->second);
  };
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::istringstream line(text.substr(pos, end - pos));
    std::string word;
    while (line >> word) add(word);
    add("<eos>");
    pos = end + 1;
  }
  if (c.size() < 1) {
    throw UsageError(
        fmt::format("{} tokens are fewer than the {} needed for one block", c.tokens_.size(), 2 * kBlockSize));
  }
  return c;
}

std::int64_t TextCorpus::size() const { return static_cast<std::int64_t>(tokens_.size()) / kBlockSize - 1; }

void TextCorpus::item(std::int64_t i, std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets) const {
  const auto begin = tokens_.begin() + i * kBlockSize;
  inputs.assign(begin, begin + kBlockSize);
  targets.assign(begin + 1, begin + 1 + kBlockSize);
}

std::int64_t DataSchedule::batches_before(std::int64_t step) const {
  const std::int64_t steps = steps_per_epoch();
  return step / steps * batches_per_epoch() + std::min(step % steps * accumulate, batches_per_epoch());
}

std::int64_t DataSchedule::batches_in_step(std::int64_t step) const {
  return std::min(accumulate, batches_per_epoch() - step % steps_per_epoch() * accumulate);
}

std::vector<std::int64_t> rank_items(std::int64_t step, std::int64_t global_batch, int rank, int world_size,
                                     std::int64_t dataset_size) {
  const DataSchedule schedule{dataset_size, global_batch, 1};
  std::vector<std::int64_t> out;
  for (std::int64_t j = rank; j < global_batch; j += world_size) out.push_back(schedule.item(step, j));
  return out;
}

}  // namespace shardpoint::train
