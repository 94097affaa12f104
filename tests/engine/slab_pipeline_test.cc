// SlabPipeline: every byte of every tensor arrives once, in order, whatever the buffer
// size and reader count; pieces are page-aligned in their buffers; errors from either
// side stop the copy and reach the caller.
#include "engine/slab_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace shardpoint::engine {
namespace {

// The byte at row-major element index i, byte b of a tensor k.
std::byte pattern(std::size_t k, std::uint64_t at) { return static_cast<std::byte>((k * 131 + at * 7) & 0xff); }

// Fills dest with the pattern for the piece (boxed: offsets -> byte position row-major).
void fill(const std::vector<SlabTensor>& tensors, const SlabPiece& p, std::span<std::byte> dest) {
  const SlabTensor& t = tensors[p.k];
  std::uint64_t at = p.at;
  if (t.boxed && !t.shape.empty()) {
    // A box is one contiguous run: its start is the row-major position of its offsets.
    at = 0;
    for (std::size_t d = 0; d < t.shape.size(); ++d) at = at * static_cast<std::uint64_t>(t.shape[d]) + p.offsets[d];
    at *= t.itemsize;
  }
  ASSERT_EQ(at, p.at);
  for (std::size_t i = 0; i < dest.size(); ++i) dest[i] = pattern(p.k, at + i);
}

void expect_copied(const std::vector<SlabTensor>& tensors, const SlabPipelineOptions& options) {
  SlabPipeline pipeline(options);
  std::vector<std::vector<std::byte>> out(tensors.size());
  std::vector<int> begins(tensors.size()), ends(tensors.size());
  std::size_t current = 0;
  SlabCallbacks cb;
  cb.read = [&](const SlabPiece& p, std::span<std::byte> dest) {
    EXPECT_EQ(p.buffer_offset % kSlabPage, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(dest.data()) % kSlabPage, 0u);
    fill(tensors, p, dest);
  };
  cb.begin = [&](std::size_t k) {
    ++begins[k];
    current = k;
  };
  cb.write = [&](std::span<const std::byte> data) {
    out[current].insert(out[current].end(), data.begin(), data.end());
  };
  cb.end = [&](std::size_t k) {
    EXPECT_EQ(k, current);
    ++ends[k];
  };
  pipeline.run(tensors, cb);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    EXPECT_EQ(begins[k], 1) << k;
    EXPECT_EQ(ends[k], 1) << k;
    ASSERT_EQ(out[k].size(), tensors[k].nbytes()) << k;
    for (std::size_t i = 0; i < out[k].size(); ++i) ASSERT_EQ(out[k][i], pattern(k, i)) << k << " " << i;
  }
}

TEST(SlabPipelineTest, CopiesEveryByteInOrder) {
  const std::vector<SlabTensor> tensors = {
      {{100, 50}, 4, true},     // 20000 bytes: several boxes per 4 KiB buffer
      {{}, 8, true},            // 0-dim
      {{3, 0}, 4, true},        // no elements: one empty piece
      {{7}, 2, true},           // packed with others into one buffer
      {{10000}, 1, false},      // byte ranges
      {{2, 3, 5000}, 2, true},  // rows larger than a buffer: split along the last dim
  };
  for (std::size_t readers : {1, 2, 3}) {
    for (std::size_t buffer_bytes : {kSlabPage, 3 * kSlabPage}) {
      SlabPipelineOptions options;
      options.buffers = 4;
      options.buffer_bytes = buffer_bytes;
      options.readers = readers;
      options.read_ahead = 2;
      SCOPED_TRACE(std::to_string(readers) + " readers, " + std::to_string(buffer_bytes) + " bytes per buffer");
      expect_copied(tensors, options);
    }
  }
}

TEST(SlabPipelineTest, NoTensorsWritesNothing) { expect_copied({}, SlabPipelineOptions{}); }

TEST(SlabPipelineTest, ReadErrorReachesTheCaller) {
  SlabPipelineOptions options;
  options.buffer_bytes = kSlabPage;
  SlabPipeline pipeline(options);
  const std::vector<SlabTensor> tensors = {{{100000}, 1, false}};
  std::atomic<int> reads{0};
  SlabCallbacks cb;
  cb.read = [&](const SlabPiece& p, std::span<std::byte>) {
    if (++reads == 5) throw std::runtime_error("disk on fire");
  };
  cb.write = [](std::span<const std::byte>) {};
  EXPECT_THROW(pipeline.run(tensors, cb), std::runtime_error);
}

TEST(SlabPipelineTest, WriterErrorStopsTheReaders) {
  SlabPipelineOptions options;
  options.buffer_bytes = kSlabPage;
  SlabPipeline pipeline(options);
  const std::vector<SlabTensor> tensors = {{{1000000}, 1, false}};
  std::atomic<int> reads{0};
  SlabCallbacks cb;
  cb.read = [&](const SlabPiece&, std::span<std::byte>) { ++reads; };
  cb.write = [](std::span<const std::byte>) {};
  int buffers = 0;
  cb.after_buffer = [&] {
    if (++buffers == 3) throw std::runtime_error("cancelled");
  };
  EXPECT_THROW(pipeline.run(tensors, cb), std::runtime_error);
  EXPECT_LT(reads.load(), 3 + 4 + 2);  // at most the buffers in flight, not the whole tensor
}

}  // namespace
}  // namespace shardpoint::engine
