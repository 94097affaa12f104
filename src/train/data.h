// Language-model data in WikiText-2 format (spec: lightning-behaviour.md §11.2), as the
// Lightning demo reads it: `train.txt`, UTF-8, one line at a time; words are the line split
// on whitespace plus "<eos>" appended to every line (a blank line is just "<eos>");
// vocabulary in first-occurrence order; the tokens concatenated; item i is the block
// tokens[35i, 35i+35) with targets shifted by one; len = n / 35 - 1.
//
// Batches (shardpoint's schedule): step s uses the `global_batch` items s*G .. s*G+G-1
// (wrapping around the dataset; an epoch is one pass), and rank r of W takes every W-th of
// them (positions r, r+W, ...), like DistributedSampler without shuffling. Because the
// global batch does not depend on W, a run resumed on another world size sees the same
// data. Thread-compatible; immutable after load.
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

// The global item indices rank `rank` of `world_size` processes at step `step` (0-based)
// with `global_batch` items per step, wrapping around `dataset_size` items.
std::vector<std::int64_t> rank_items(std::int64_t step, std::int64_t global_batch, int rank, int world_size,
                                     std::int64_t dataset_size);

// The epoch step `step` (0-based) belongs to: (step * global_batch) / dataset_size.
std::int64_t epoch_of_step(std::int64_t step, std::int64_t global_batch, std::int64_t dataset_size);

}  // namespace shardpoint::train
