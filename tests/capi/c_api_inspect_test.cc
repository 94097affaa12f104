// sp_inspect (include/shardpoint/c_api.h): a checkpoint folder's structure as a
// size-versioned result struct, called as a binding calls it: through libshardpoint.so only.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi/c_api_test_util.h"
#include "shardpoint/c_api.h"

namespace {

using namespace shardpoint::capi_test;

TEST(CApiInspect, TensorsChunksFilesAndSidecar) {
  TempDir dir;
  const std::string source = (dir.path() / "ckpt").string();
  save_two_tensors(source);
  char* error = nullptr;
  sp_inspect_options options;
  sp_inspect_options_init(&options);
  EXPECT_EQ(options.struct_size, sizeof(sp_inspect_options));
  auto r = sized(&sp_inspect_result_init);
  ASSERT_EQ(sp_inspect(source.c_str(), &options, &r, &error), SP_OK) << take(error);
  EXPECT_EQ(r.format, SP_CHECKPOINT_DCP);
  EXPECT_EQ(r.sidecar, SP_CHECKSUM_CRC32C);
  ASSERT_EQ(r.tensor_count, 2u);
  EXPECT_STREQ(r.tensors[0].fqn, "model.b");  // sorted by fqn
  const sp_inspect_tensor& w = r.tensors[1];
  EXPECT_STREQ(w.fqn, "model.w");
  EXPECT_STREQ(w.dtype, "float32");
  ASSERT_EQ(w.ndim, 2);
  EXPECT_EQ(std::vector<int64_t>(w.shape, w.shape + 2), (std::vector<int64_t>{8, 4}));
  ASSERT_EQ(w.chunk_count, 1u);
  EXPECT_EQ(std::vector<int64_t>(w.chunks[0].offsets, w.chunks[0].offsets + 2), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(std::vector<int64_t>(w.chunks[0].sizes, w.chunks[0].sizes + 2), (std::vector<int64_t>{8, 4}));
  EXPECT_STREQ(w.chunks[0].storage.file, "__0_0.distcp");
  EXPECT_GT(w.chunks[0].storage.length, 32u * 4u);  // a torch.save blob: records around the data
  EXPECT_EQ(w.chunks[0].storage.transform_descriptor_count, 0u);
  EXPECT_EQ(r.object_count, 0u);
  ASSERT_EQ(r.file_count, 1u);
  EXPECT_STREQ(r.files[0], "__0_0.distcp");
  sp_inspect_result_free(&r);
  EXPECT_EQ(r.owner, nullptr);
  EXPECT_EQ(r.tensors, nullptr);
  EXPECT_EQ(r.tensor_count, 0u);

  auto missing = sized(&sp_inspect_result_init);
  EXPECT_EQ(sp_inspect((dir.path() / "absent").c_str(), nullptr, &missing, &error), SP_ERROR_NOT_FOUND);
  take(error);
  EXPECT_EQ(missing.owner, nullptr);
  EXPECT_EQ(missing.tensor_count, 0u);

  // A caller built when the result ended before the objects, with options of today's
  // first field only: the tensors come back, no byte past struct_size is written.
  struct {
    sp_inspect_result result;
    unsigned char after[8];
  } old;
  std::memset(&old, 0xab, sizeof old);
  old.result.struct_size = offsetof(sp_inspect_result, object_count);
  sp_inspect_options old_options;
  old_options.struct_size = sizeof(size_t);
  ASSERT_EQ(sp_inspect(source.c_str(), &old_options, &old.result, &error), SP_OK) << take(error);
  EXPECT_EQ(old.result.tensor_count, 2u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old);
  for (std::size_t i = offsetof(sp_inspect_result, object_count); i < sizeof old; ++i) {
    ASSERT_EQ(bytes[i], 0xab) << "byte " << i << " written past struct_size";
  }
  sp_inspect_result_free(&old.result);
  EXPECT_EQ(old.result.owner, nullptr);
  EXPECT_EQ(bytes[offsetof(sp_inspect_result, object_count)], 0xab);
}

}  // namespace
