// torch::Tensor <-> TensorShard without copies, dim-0 boxes, and a sharded save on 3
// in-process ranks loaded back on 2 through the engine.
#include "torch/tensor_adapter.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "comm/thread_communicator.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "storage/memory_storage.h"

namespace shardpoint::torchx {
namespace {

TEST(TensorAdapterTest, DTypesRoundTrip) {
  for (auto t : {c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half, c10::ScalarType::BFloat16,
                 c10::ScalarType::Long, c10::ScalarType::Int, c10::ScalarType::Bool, c10::ScalarType::Byte}) {
    EXPECT_EQ(scalar_type_from_dtype(dtype_from_scalar_type(t)), t);
  }
  EXPECT_THROW(scalar_type_from_dtype(DType::kFloat8_e4m3fn), UsageError);
  EXPECT_THROW(dtype_from_scalar_type(c10::ScalarType::QInt8), UsageError);
}

TEST(TensorAdapterTest, ShardAliasesTensorMemory) {
  at::Tensor t = at::arange(12, at::kFloat).reshape({4, 3});
  engine::TensorShard s = shard_of(t, {10, 3}, {4, 0});
  EXPECT_EQ(s.dtype, DType::kFloat32);
  EXPECT_EQ(s.sizes, (Shape{4, 3}));
  EXPECT_EQ(s.global_shape, (Shape{10, 3}));
  EXPECT_EQ(static_cast<void*>(s.data.data()), t.data_ptr());
  EXPECT_EQ(s.data.size(), 48u);
  at::Tensor back = tensor_of(s);
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
  EXPECT_TRUE(at::equal(back, t));
  EXPECT_THROW(shard_of(t.t(), {3, 4}, {0, 0}), UsageError);  // not contiguous
  EXPECT_THROW(shard_of(t, {4, 3}, {0}), UsageError);         // wrong offsets
  at::Tensor scalar = at::scalar_tensor(2.5, at::kFloat);
  engine::TensorShard z = whole_of(scalar);
  EXPECT_TRUE(z.sizes.empty());
  EXPECT_EQ(z.data.size(), 4u);
}

TEST(TensorAdapterTest, Dim0BoxesAreCeilChunks) {
  EXPECT_EQ(dim0_box({10, 3}, 0, 4).sizes, (Shape{3, 3}));
  EXPECT_EQ(dim0_box({10, 3}, 3, 4).offsets, (Shape{9, 0}));
  EXPECT_EQ(dim0_box({10, 3}, 3, 4).sizes, (Shape{1, 3}));
  EXPECT_EQ(dim0_box({2}, 3, 4).sizes, (Shape{0}));  // empty last piece
  EXPECT_TRUE(dim0_box({}, 1, 4).sizes.empty());
  at::Tensor full = at::arange(10, at::kFloat);
  EXPECT_TRUE(at::equal(dim0_slice(full, 1, 4), at::arange(3, 6, at::kFloat)));
}

TEST(TensorAdapterTest, StateRejectsWrongLocalShape) {
  std::vector<NamedShard> shards{{"w", at::zeros({4, 3}), {10, 3}}};
  EXPECT_THROW(dim0_sharded_state(shards, 3, 4), UsageError);
}

TEST(TensorAdapterTest, SavesOnThreeRanksLoadsOnTwo) {
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  const at::Tensor w = at::arange(70, at::kFloat).reshape({7, 10});
  const at::Tensor b = at::arange(7, at::kDouble);
  const at::Tensor step = at::scalar_tensor(3.0, at::kFloat);
  auto shards_for = [&](int rank, int world, bool zero) {
    auto pick = [&](const at::Tensor& full) {
      return zero ? at::zeros_like(dim0_slice(full, rank, world)) : dim0_slice(full, rank, world);
    };
    return std::vector<NamedShard>{{"w", pick(w), {7, 10}}, {"b", pick(b), {7}}, {"step", pick(step), {}}};
  };
  {
    comm::ThreadGroup group(3, comm::CommOptions{std::chrono::seconds(20)});
    group.run([&](comm::Communicator& c) {
      auto shards = shards_for(c.rank(), 3, false);
      engine::save(dim0_sharded_state(shards, c.rank(), 3), *st, c);
    });
  }
  comm::ThreadGroup group(2, comm::CommOptions{std::chrono::seconds(20)});
  group.run([&](comm::Communicator& c) {
    auto shards = shards_for(c.rank(), 2, true);
    engine::StateNode node = dim0_sharded_state(shards, c.rank(), 2);
    engine::load(node, *st, c);
    EXPECT_TRUE(at::equal(shards[0].local, dim0_slice(w, c.rank(), 2)));
    EXPECT_TRUE(at::equal(shards[1].local, dim0_slice(b, c.rank(), 2)));
    EXPECT_EQ(shards[2].local.item<float>(), 3.0f);
  });
}

}  // namespace
}  // namespace shardpoint::torchx
