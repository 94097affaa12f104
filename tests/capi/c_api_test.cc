// The C API's option and result structs (size-versioned) for consolidate, reshard and
// verify, the names of their enums, and the checkpoint-folder rules and file split it
// exposes (include/shardpoint/c_api.h), called as a binding calls them: through
// libshardpoint.so only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardpoint/c_api.h"

namespace {

namespace fs = std::filesystem;

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() : path_(fs::path(::testing::TempDir()) / ("sp_c_api_" + std::to_string(::getpid()) + "_" + next())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  static std::string next() {
    static int n = 0;
    return std::to_string(n++);
  }
  fs::path path_;
};

// A result struct as its *_init leaves it (zeroed, today's struct_size).
template <typename Result>
Result sized(void (*init)(Result*)) {
  Result r;
  std::memset(&r, 0xee, sizeof r);
  init(&r);
  return r;
}

// The message of a failed call (freed), or "" when there is none.
std::string take(char* error) {
  std::string s = error != nullptr ? error : "";
  sp_free(error);
  return s;
}

// Saves a DCP checkpoint of two float32 tensors ("model.w" 8x4, "model.b" 4) at path.
void save_two_tensors(const std::string& path) {
  static float w[8][4], b[4];
  for (int i = 0; i < 32; ++i) w[i / 4][i % 4] = static_cast<float>(i);
  for (int i = 0; i < 4; ++i) b[i] = static_cast<float>(-i);
  const int64_t w_shape[2] = {8, 4}, zero[2] = {0, 0}, b_shape[1] = {4};
  const sp_tensor tensors[2] = {{"model.w", "float32", 2, w_shape, zero, w_shape, w, sizeof w},
                                {"model.b", "float32", 1, b_shape, zero, b_shape, b, sizeof b}};
  sp_checkpoint* ckpt = nullptr;
  char* error = nullptr;
  ASSERT_EQ(sp_checkpoint_open(path.c_str(), &ckpt, &error), SP_OK) << take(error);
  ASSERT_EQ(sp_save(ckpt, tensors, 2, nullptr, &error), SP_OK) << take(error);
  sp_checkpoint_close(ckpt);
}

void write_file(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(CApiNames, RoundTripEveryKind) {
  const std::vector<std::pair<sp_name_kind, std::vector<const char*>>> kinds = {
      {SP_NAME_CHECKSUM, {"none", "crc32c", "xxh3"}},
      {SP_NAME_COMPRESSION, {"none", "zstd"}},
      {SP_NAME_LAYOUT, {"trainer", "fabric", "dcp"}},
      {SP_NAME_OUTPUT_FORMAT, {"torch", "safetensors", "hf-safetensors"}},
      {SP_NAME_CHECKPOINT_FORMAT, {"dcp", "hf-safetensors", "torch"}},
  };
  for (const auto& [kind, names] : kinds) {
    for (int v = 0; v < static_cast<int>(names.size()); ++v) {
      int value = -1;
      char* error = nullptr;
      ASSERT_EQ(sp_value_of_name(kind, names[v], &value, &error), SP_OK) << take(error);
      EXPECT_EQ(value, v) << names[v];
      ASSERT_NE(sp_name_of_value(kind, v), nullptr);
      EXPECT_STREQ(sp_name_of_value(kind, v), names[v]);
    }
    EXPECT_EQ(sp_name_of_value(kind, static_cast<int>(names.size())), nullptr);
  }
  EXPECT_EQ(SP_LAYOUT_DCP, 2);
  EXPECT_EQ(SP_FORMAT_HF_SAFETENSORS, 2);
}

TEST(CApiNames, UnknownNameListsTheAcceptedOnes) {
  int value = -1;
  char* error = nullptr;
  ASSERT_EQ(sp_value_of_name(SP_NAME_LAYOUT, "nope", &value, &error), SP_ERROR_USAGE);
  const std::string message = take(error);
  EXPECT_NE(message.find("trainer, fabric, dcp"), std::string::npos) << message;
  EXPECT_NE(message.find("\"nope\""), std::string::npos) << message;
  ASSERT_EQ(sp_value_of_name(SP_NAME_CHECKSUM, "md5", &value, &error), SP_ERROR_USAGE);
  EXPECT_NE(take(error).find("crc32c"), std::string::npos);
}

TEST(CApiTools, VerifyReshardConsolidateFillTheirResults) {
  TempDir dir;
  const std::string source = (dir.path() / "ckpt").string();
  save_two_tensors(source);
  char* error = nullptr;

  auto verified = sized(&sp_verify_result_init);
  ASSERT_EQ(sp_verify(source.c_str(), nullptr, &verified, &error), SP_OK) << take(error);
  EXPECT_EQ(verified.ok, 1);
  EXPECT_EQ(verified.tensors, 2u);
  EXPECT_EQ(verified.problem_count, 0u);
  EXPECT_EQ(verified.bytes, (32u + 4u) * 4u);
  EXPECT_EQ(verified.verified_bytes, verified.bytes);
  ASSERT_EQ(verified.coverage_count, 1u);
  EXPECT_EQ(verified.coverage[0].format, SP_CHECKPOINT_DCP);
  EXPECT_EQ(verified.coverage[0].sidecar, SP_CHECKSUM_CRC32C);
  EXPECT_EQ(verified.coverage[0].quick, 0);
  sp_verify_result_free(&verified);
  EXPECT_EQ(verified.owner, nullptr);
  EXPECT_EQ(verified.problems, nullptr);

  sp_verify_options quick;
  sp_verify_options_init(&quick);
  EXPECT_EQ(quick.quick, 0);
  quick.quick = 1;
  ASSERT_EQ(sp_verify(source.c_str(), &quick, &verified, &error), SP_OK) << take(error);
  EXPECT_EQ(verified.bytes, 0u);
  EXPECT_EQ(verified.coverage[0].quick, 1);
  sp_verify_result_free(&verified);

  const std::string resharded = (dir.path() / "three").string();
  sp_reshard_options reshard_options;
  sp_reshard_options_init(&reshard_options);
  EXPECT_EQ(reshard_options.memory_budget_bytes, uint64_t{256} << 20);
  EXPECT_EQ(reshard_options.checksum, SP_CHECKSUM_CRC32C);
  reshard_options.checksum = SP_CHECKSUM_XXH3;
  auto r = sized(&sp_reshard_result_init);
  ASSERT_EQ(sp_reshard(source.c_str(), resharded.c_str(), 3, &reshard_options, &r, &error), SP_OK) << take(error);
  EXPECT_EQ(r.source_format, SP_CHECKPOINT_DCP);
  EXPECT_EQ(r.tensors, 2u);
  EXPECT_EQ(r.payload_bytes, (32u + 4u) * 4u);
  EXPECT_EQ(r.meta_pt_bytes, 0u);
  EXPECT_EQ(r.zip_crc.records_checked, 0u);  // the sidecar covers every blob
  EXPECT_TRUE(fs::exists(fs::path(resharded) / "__2_0.distcp"));
  ASSERT_EQ(sp_verify(resharded.c_str(), nullptr, &verified, &error), SP_OK) << take(error);
  EXPECT_EQ(verified.coverage[0].sidecar, SP_CHECKSUM_XXH3);
  sp_verify_result_free(&verified);

  const std::string out = (dir.path() / "model.safetensors").string();
  sp_consolidate_options consolidate_options;
  sp_consolidate_options_init(&consolidate_options);
  EXPECT_EQ(consolidate_options.memory_budget_bytes, uint64_t{256} << 20);
  EXPECT_EQ(consolidate_options.layout, SP_LAYOUT_TRAINER);
  consolidate_options.output_file = out.c_str();
  consolidate_options.layout = SP_LAYOUT_DCP;
  consolidate_options.format = SP_FORMAT_SAFETENSORS;
  auto c = sized(&sp_consolidate_result_init);
  ASSERT_EQ(sp_consolidate(resharded.c_str(), &consolidate_options, &c, &error), SP_OK) << take(error);
  ASSERT_NE(c.output, nullptr);
  EXPECT_EQ(std::string(c.output), out);
  EXPECT_EQ(c.tensors, 2u);
  EXPECT_EQ(c.tensor_bytes, (32u + 4u) * 4u);
  EXPECT_TRUE(fs::exists(out));
  sp_consolidate_result_free(&c);
  EXPECT_EQ(c.output, nullptr);
}

TEST(CApiTools, DamagedCheckpointIsAResultNotAnError) {
  TempDir dir;
  const std::string source = (dir.path() / "ckpt").string();
  save_two_tensors(source);
  const fs::path data = fs::path(source) / "__0_0.distcp";
  std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(data) / 2));
  f.put('\x5a');
  f.close();
  char* error = nullptr;
  auto verified = sized(&sp_verify_result_init);
  ASSERT_EQ(sp_verify(source.c_str(), nullptr, &verified, &error), SP_OK) << take(error);
  EXPECT_EQ(verified.ok, 0);
  ASSERT_GE(verified.problem_count, 1u);
  EXPECT_STREQ(verified.problems[0].file, "__0_0.distcp");
  EXPECT_NE(std::strstr(verified.problems[0].message, "__0_0.distcp"), nullptr) << verified.problems[0].message;
  sp_verify_result_free(&verified);

  ASSERT_EQ(sp_verify((dir.path() / "absent").c_str(), nullptr, &verified, &error), SP_ERROR_NOT_FOUND);
  take(error);
  EXPECT_EQ(verified.owner, nullptr);
}

TEST(CApiTools, OptionsOutOfRangeAreUsageErrors) {
  TempDir dir;
  const std::string source = (dir.path() / "ckpt").string();
  save_two_tensors(source);
  char* error = nullptr;
  sp_consolidate_options o;
  sp_consolidate_options_init(&o);
  o.layout = 7;
  auto c = sized(&sp_consolidate_result_init);
  EXPECT_EQ(sp_consolidate(source.c_str(), &o, &c, &error), SP_ERROR_USAGE);
  EXPECT_NE(take(error).find("layout"), std::string::npos);
  EXPECT_EQ(c.output, nullptr);
  sp_reshard_options ro;
  sp_reshard_options_init(&ro);
  ro.compression = 9;
  auto r = sized(&sp_reshard_result_init);
  EXPECT_EQ(sp_reshard(source.c_str(), (dir.path() / "x").c_str(), 2, &ro, &r, &error), SP_ERROR_USAGE);
  EXPECT_NE(take(error).find("compression"), std::string::npos);
  EXPECT_EQ(sp_verify(source.c_str(), nullptr, nullptr, &error), SP_ERROR_USAGE);
  take(error);
  auto tiny = sized(&sp_verify_result_init);
  tiny.struct_size = sizeof(size_t);  // too small to hold what the library allocates
  EXPECT_EQ(sp_verify(source.c_str(), nullptr, &tiny, &error), SP_ERROR_USAGE);
  take(error);
}

// What a program built against an older header passes: structs that end before today's
// last fields. The library reads the options it is given (defaults for the rest) and
// writes no byte of a result past the caller's struct_size.
TEST(CApiVersioning, OlderSmallerStructsStillWork) {
  TempDir dir;
  const std::string source = (dir.path() / "ckpt").string();
  save_two_tensors(source);
  char* error = nullptr;

  // Options that end before memory_budget_bytes: the bytes after are garbage, not read.
  struct {
    sp_consolidate_options options;
    unsigned char garbage[8];
  } old_consolidate;
  std::memset(&old_consolidate, 0xff, sizeof old_consolidate);
  const std::string out = (dir.path() / "old.pt").string();
  old_consolidate.options.struct_size = offsetof(sp_consolidate_options, memory_budget_bytes);
  old_consolidate.options.output_file = out.c_str();
  old_consolidate.options.layout = SP_LAYOUT_DCP;
  old_consolidate.options.format = SP_FORMAT_TORCH;
  old_consolidate.options.max_shard_bytes = 0;
  auto c = sized(&sp_consolidate_result_init);
  ASSERT_EQ(sp_consolidate(source.c_str(), &old_consolidate.options, &c, &error), SP_OK) << take(error);
  EXPECT_EQ(std::string(c.output), out);
  sp_consolidate_result_free(&c);

  // A reshard result that ends before zip_crc: the fields after it keep the caller's bytes.
  struct {
    sp_reshard_result result;
    unsigned char after[8];
  } old_result;
  std::memset(&old_result, 0xab, sizeof old_result);
  old_result.result.struct_size = offsetof(sp_reshard_result, zip_crc);
  sp_reshard_options ro;
  sp_reshard_options_init(&ro);
  ro.struct_size = offsetof(sp_reshard_options, checksum);  // checksum, compression: defaults
  ASSERT_EQ(sp_reshard(source.c_str(), (dir.path() / "two").c_str(), 2, &ro, &old_result.result, &error), SP_OK)
      << take(error);
  EXPECT_EQ(old_result.result.struct_size, offsetof(sp_reshard_result, zip_crc));
  EXPECT_EQ(old_result.result.tensors, 2u);
  EXPECT_EQ(old_result.result.bytes_written > 0, true);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old_result);
  for (std::size_t i = offsetof(sp_reshard_result, zip_crc); i < sizeof old_result; ++i) {
    ASSERT_EQ(bytes[i], 0xab) << "byte " << i << " written past struct_size";
  }

  // A verify result that ends before the coverage: problems filled, the owner freed.
  sp_verify_result v;
  std::memset(&v, 0xcd, sizeof v);
  v.struct_size = offsetof(sp_verify_result, coverage_count);
  ASSERT_EQ(sp_verify(source.c_str(), nullptr, &v, &error), SP_OK) << take(error);
  EXPECT_EQ(v.ok, 1);
  EXPECT_EQ(v.problem_count, 0u);
  const auto* vbytes = reinterpret_cast<const unsigned char*>(&v);
  EXPECT_EQ(vbytes[offsetof(sp_verify_result, coverage_count)], 0xcd);
  sp_verify_result_free(&v);
  EXPECT_EQ(v.owner, nullptr);
}

TEST(CApiFiles, CommitRuleListingAndRemoval) {
  TempDir dir;
  const fs::path folder = dir.path() / "checkpoints";
  for (const char* name : {"epoch=0-step=20.ckpt", "epoch=0-step=3.ckpt", "nostep.ckpt"}) {
    write_file(folder / name / ".metadata", "m");
    write_file(folder / name / "meta.pt", "p");
    write_file(folder / name / "__0_0.distcp", "d");
  }
  write_file(folder / "epoch=0-step=99.ckpt" / ".metadata", "m");  // no meta.pt: not committed
  write_file(folder / "full.ckpt", "a file");
  char* error = nullptr;
  int committed = -1;
  ASSERT_EQ(sp_checkpoint_committed((folder / "epoch=0-step=3.ckpt").c_str(), &committed, &error), SP_OK)
      << take(error);
  EXPECT_EQ(committed, 1);
  ASSERT_EQ(sp_checkpoint_committed((folder / "epoch=0-step=99.ckpt").c_str(), &committed, &error), SP_OK);
  EXPECT_EQ(committed, 0);
  ASSERT_EQ(sp_checkpoint_committed((folder / "absent").c_str(), &committed, &error), SP_OK);
  EXPECT_EQ(committed, 0);
  const std::string file_url = "file://" + (folder / "nostep.ckpt").string();
  ASSERT_EQ(sp_checkpoint_committed(file_url.c_str(), &committed, &error), SP_OK) << take(error);
  EXPECT_EQ(committed, 1);

  sp_string_list list{};
  ASSERT_EQ(sp_list_committed_checkpoints(folder.c_str(), &list, &error), SP_OK) << take(error);
  ASSERT_EQ(list.count, 3u);
  EXPECT_EQ(std::string(list.items[0]), (folder / "nostep.ckpt").string());  // no step: first
  EXPECT_EQ(std::string(list.items[1]), (folder / "epoch=0-step=3.ckpt").string());
  EXPECT_EQ(std::string(list.items[2]), (folder / "epoch=0-step=20.ckpt").string());
  sp_string_list_free(&list);
  EXPECT_EQ(list.items, nullptr);
  ASSERT_EQ(sp_list_committed_checkpoints((dir.path() / "absent").c_str(), &list, &error), SP_OK);
  EXPECT_EQ(list.count, 0u);
  sp_string_list_free(&list);
  EXPECT_EQ(sp_list_committed_checkpoints("s3://bucket/checkpoints", &list, &error), SP_ERROR_USAGE);
  take(error);

  ASSERT_EQ(sp_remove_checkpoint((folder / "epoch=0-step=3.ckpt").c_str(), &error), SP_OK) << take(error);
  EXPECT_FALSE(fs::exists(folder / "epoch=0-step=3.ckpt"));
  ASSERT_EQ(sp_remove_checkpoint((folder / "full.ckpt").c_str(), &error), SP_OK) << take(error);
  EXPECT_FALSE(fs::exists(folder / "full.ckpt"));
  EXPECT_EQ(sp_remove_checkpoint((folder / "absent").c_str(), &error), SP_OK);
}

TEST(CApiFiles, RemoteCommitRuleAndRemoval) {
  const std::string url = "memory://c_api_files/ckpt";
  sp_checkpoint* ckpt = nullptr;
  char* error = nullptr;
  ASSERT_EQ(sp_checkpoint_open(url.c_str(), &ckpt, &error), SP_OK) << take(error);
  for (const char* key : {"__0_0.distcp", ".metadata"}) {
    ASSERT_EQ(sp_write_object(ckpt, key, "x", 1, 0, &error), SP_OK) << take(error);
  }
  int committed = -1;
  ASSERT_EQ(sp_checkpoint_committed(url.c_str(), &committed, &error), SP_OK) << take(error);
  EXPECT_EQ(committed, 0);  // no meta.pt yet
  ASSERT_EQ(sp_write_object(ckpt, "meta.pt", "p", 1, 0, &error), SP_OK);
  ASSERT_EQ(sp_checkpoint_committed(url.c_str(), &committed, &error), SP_OK);
  EXPECT_EQ(committed, 1);
  ASSERT_EQ(sp_remove_checkpoint(url.c_str(), &error), SP_OK) << take(error);
  ASSERT_EQ(sp_checkpoint_committed(url.c_str(), &committed, &error), SP_OK);
  EXPECT_EQ(committed, 0);
  void* data = nullptr;
  size_t size = 0;
  int found = -1;
  ASSERT_EQ(sp_read_object(ckpt, "__0_0.distcp", &data, &size, &found, &error), SP_OK);
  EXPECT_EQ(found, 0);
  sp_checkpoint_close(ckpt);
}

TEST(CApiFiles, StagingFolderNamesAndLeftovers) {
  TempDir dir;
  const fs::path target = dir.path() / "last.ckpt";
  char* error = nullptr;
  char* path = nullptr;
  ASSERT_EQ(sp_staging_folder(target.c_str(), "0123456789abcdef0123456789abcdef", &path, &error), SP_OK) << take(error);
  EXPECT_EQ(std::string(path), (dir.path() / ".last.ckpt.sp-replace-0123456789abcdef").string());
  sp_free(path);
  EXPECT_EQ(sp_staging_folder("s3://bucket/last.ckpt", "save", &path, &error), SP_ERROR_USAGE);
  take(error);

  write_file(dir.path() / ".last.ckpt.sp-replace-save" / "__0_0.distcp", "x");
  write_file(dir.path() / ".last.ckpt.sp-replace-1234" / "__0_0.distcp", "x");
  write_file(dir.path() / ".other.ckpt.sp-replace-save" / "__0_0.distcp", "x");  // another target's
  write_file(target / ".metadata", "m");
  size_t removed = 0;
  ASSERT_EQ(sp_remove_stale_staging(target.c_str(), &removed, &error), SP_OK) << take(error);
  EXPECT_EQ(removed, 2u);
  EXPECT_TRUE(fs::exists(dir.path() / ".other.ckpt.sp-replace-save"));
  EXPECT_TRUE(fs::exists(target / ".metadata"));
  ASSERT_EQ(sp_remove_stale_staging("s3://bucket/last.ckpt", &removed, &error), SP_OK) << take(error);
  EXPECT_EQ(removed, 0u);
}

TEST(CApiFiles, SplitIntoFilesIsTheSavesRule) {
  TempDir dir;
  sp_checkpoint* ckpt = nullptr;
  char* error = nullptr;
  ASSERT_EQ(sp_checkpoint_open(dir.path().c_str(), &ckpt, &error), SP_OK) << take(error);
  // bytes, 100 KiB, bytes, 1 KiB, 300 KiB, 200 KiB
  const int kinds[] = {SP_ITEM_BYTES, SP_ITEM_TENSOR, SP_ITEM_BYTES, SP_ITEM_TENSOR, SP_ITEM_TENSOR, SP_ITEM_TENSOR};
  const uint64_t nbytes[] = {0, 100 << 10, 0, 1 << 10, 300 << 10, 200 << 10};
  int file_of_item[6];
  size_t order[6];
  int files = 0;
  ASSERT_EQ(sp_split_into_files(ckpt, 2, 1, kinds, nbytes, 6, file_of_item, order, &files, &error), SP_OK)
      << take(error);
  // Bytes round-robin; tensors largest first onto the lighter file: 300 -> 0, 200 -> 1,
  // 100 -> 1, 1 -> 0. In a file: bytes, then tensors under 64 KiB, then the rest.
  EXPECT_EQ(files, 2);
  EXPECT_EQ(std::vector<int>(file_of_item, file_of_item + 6), (std::vector<int>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(std::vector<size_t>(order, order + 6), (std::vector<size_t>{0, 3, 4, 2, 5, 1}));

  ASSERT_EQ(sp_split_into_files(ckpt, 1, 1, kinds, nbytes, 6, file_of_item, order, &files, &error), SP_OK);
  EXPECT_EQ(files, 1);
  EXPECT_EQ(std::vector<size_t>(order, order + 6), (std::vector<size_t>{0, 2, 3, 1, 4, 5}));

  ASSERT_EQ(sp_split_into_files(ckpt, 4, 0, kinds, nbytes, 6, file_of_item, order, &files, &error), SP_OK);
  EXPECT_EQ(files, 6);  // one file per item, in order
  EXPECT_EQ(std::vector<int>(file_of_item, file_of_item + 6), (std::vector<int>{0, 1, 2, 3, 4, 5}));

  // More files asked than the items fill: the empty ones are not counted.
  ASSERT_EQ(sp_split_into_files(ckpt, 8, 1, kinds, nbytes, 2, file_of_item, order, &files, &error), SP_OK);
  EXPECT_EQ(files, 1);
  EXPECT_EQ(sp_split_into_files(ckpt, 0, 1, kinds, nbytes, 2, file_of_item, order, &files, &error), SP_ERROR_USAGE);
  take(error);
  const int bad_kind[] = {5};
  EXPECT_EQ(sp_split_into_files(ckpt, 1, 1, bad_kind, nbytes, 1, file_of_item, order, &files, &error), SP_ERROR_USAGE);
  take(error);
  sp_checkpoint_close(ckpt);
}

TEST(CApiCopy, CopyRangesCopiesEachRange) {
  // A range the streaming path takes (1 MiB + 5, unaligned), one below its threshold, an empty one.
  std::vector<unsigned char> big((1 << 20) + 6), small(100), out_big(big.size(), 0), out_small(small.size(), 0);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 7 + 1);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<unsigned char>(i + 3);
  void* const dsts[] = {out_big.data() + 1, out_small.data(), out_small.data()};
  const void* const srcs[] = {big.data() + 1, small.data(), small.data()};
  const uint64_t sizes[] = {big.size() - 1, small.size(), 0};
  sp_copy_ranges(dsts, srcs, sizes, 3);
  EXPECT_EQ(out_big[0], 0);
  EXPECT_EQ(std::memcmp(out_big.data() + 1, big.data() + 1, big.size() - 1), 0);
  EXPECT_EQ(out_small, small);
  sp_copy_ranges(nullptr, nullptr, nullptr, 0);  // nothing to copy
}

}  // namespace
