// Language-model data in WikiText-2 format (docs/lightning-layout.md §6.2), as the
// Lightning demo reads it: `train.txt`, UTF-8, one line at a time; words are the line split
// on whitespace plus "<eos>" appended to every line (a blank line is just "<eos>");
// vocabulary in first-occurrence order; the tokens concatenated; item i is the block
// tokens[35i, 35i+35) with targets shifted by one; len = n / 35 - 1.
//
// Batches (shardpoint's schedule, DataSchedule below): a batch is `global_batch` items and
// rank r of W takes every W-th of them (slots r, r+W, ...), like DistributedSampler without
// shuffling. Because the global batch does not depend on W, a run resumed on another world
// size sees the same data. Thread-compatible; immutable after load.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardpoint::train {

inline constexpr std::int64_t kBlockSize = 35;

class TextCorpus {
 public:
  // Reads `dir`/train.txt. Throws StorageError when it cannot be read, UsageError when it
  // holds fewer than two blocks of tokens.
  static TextCorpus load(const std::string& dir);
  // Tokenises text given in memory (same rules).
  static TextCorpus from_text(const std::string& text);

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(words_.size()); }
  const std::vector<std::string>& words() const { return words_; }
  const std::vector<std::int64_t>& tokens() const { return tokens_; }
  // Number of items (blocks): tokens / 35 - 1.
  std::int64_t size() const;
  // Item i: inputs tokens[35i, 35i+35), targets tokens[35i+1, 35i+36). REQUIRES 0 <= i < size().
  void item(std::int64_t i, std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets) const;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::vector<std::int64_t> tokens_;
};

// The order data is consumed in (shardpoint's schedule, Lightning's epoch rules). An epoch is
// one pass over the dataset in order: ceil(N / G) batches of G items (global_batch), batch b
// of an epoch holding items (b*G + j) mod N, j < G, so the last batch of an epoch wraps to its
// first items (as DistributedSampler pads). An optimizer step takes accumulate_grad_batches
// (k) consecutive batches; the last step of an epoch takes what is left (Lightning steps at
// the end of an epoch), so every epoch has ceil(ceil(N / G) / k) steps and starts on a step
// boundary. Everything is a function of global_step: the data position needs no state.
struct DataSchedule {
  std::int64_t dataset_size = 1;  // N items
  std::int64_t global_batch = 1;  // G items per batch, all ranks together
  std::int64_t accumulate = 1;    // k batches per optimizer step

  std::int64_t batches_per_epoch() const { return (dataset_size + global_batch - 1) / global_batch; }
  std::int64_t steps_per_epoch() const { return (batches_per_epoch() + accumulate - 1) / accumulate; }
  // The epoch optimizer step `step` (0-based) belongs to.
  std::int64_t epoch_of_step(std::int64_t step) const { return step / steps_per_epoch(); }
  // Batches run before step `step`, counted over the whole run (a batch's position in the run).
  std::int64_t batches_before(std::int64_t step) const;
  // How many batches step `step` takes (k, or fewer for an epoch's last step).
  std::int64_t batches_in_step(std::int64_t step) const;
  // The dataset item of slot j (< G) of run batch `batch`.
  std::int64_t item(std::int64_t batch, std::int64_t j) const {
    return ((batch % batches_per_epoch()) * global_batch + j) % dataset_size;
  }
};

// The global item indices rank `rank` of `world_size` processes takes at step `step` (0-based)
// with `global_batch` items per step and no accumulation (every W-th slot from slot `rank`).
std::vector<std::int64_t> rank_items(std::int64_t step, std::int64_t global_batch, int rank, int world_size,
                                     std::int64_t dataset_size);

}  // namespace shardpoint::train
