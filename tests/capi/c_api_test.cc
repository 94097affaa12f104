// The C API's option and result structs (size-versioned) for consolidate, reshard, verify
// and the planned writes (sp_write_items' records, handed to sp_commit), the names of their
// enums, and the checkpoint-folder rules and file split it exposes
// (include/shardpoint/c_api.h), called as a binding calls them: through libshardpoint.so
// only. sp_inspect: c_api_inspect_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "capi/c_api_test_util.h"
#include "shardpoint/c_api.h"

namespace {

using namespace shardpoint::capi_test;
namespace fs = std::filesystem;

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
  // Bytes items and tensors under 64 KiB to file 0; the other tensors largest first onto the
  // lighter file: 300 -> 1, 200 -> 0, 100 -> 0. In a file: bytes, then the small tensors,
  // then the rest.
  EXPECT_EQ(files, 2);
  EXPECT_EQ(std::vector<int>(file_of_item, file_of_item + 6), (std::vector<int>{0, 0, 0, 0, 1, 0}));
  EXPECT_EQ(std::vector<size_t>(order, order + 6), (std::vector<size_t>{0, 2, 3, 5, 1, 4}));

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

// The records sp_write_items returns, handed to sp_commit as structs, commit what sp_save
// commits: the same files and the same checksum sidecar, byte for byte.
TEST(CApiWriteItems, RecordsCommitWhatSaveCommits) {
  TempDir dir;
  const std::string saved = (dir.path() / "saved").string();
  save_two_tensors(saved);
  char* error = nullptr;
  auto inspected = sized(&sp_inspect_result_init);
  ASSERT_EQ(sp_inspect(saved.c_str(), nullptr, &inspected, &error), SP_OK) << take(error);
  ASSERT_EQ(inspected.tensor_count, 2u);
  // The items in the order sp_save wrote them (by offset in the one file).
  std::vector<const sp_inspect_tensor*> order = {&inspected.tensors[0], &inspected.tensors[1]};
  std::sort(order.begin(), order.end(), [](const sp_inspect_tensor* a, const sp_inspect_tensor* b) {
    return a->chunks[0].storage.offset < b->chunks[0].storage.offset;
  });
  static float w[8][4], b[4];
  for (int i = 0; i < 32; ++i) w[i / 4][i % 4] = static_cast<float>(i);
  for (int i = 0; i < 4; ++i) b[i] = static_cast<float>(-i);
  std::vector<sp_item> items;
  for (const sp_inspect_tensor* t : order) {
    const bool is_w = std::string(t->fqn) == "model.w";
    items.push_back(sp_item{"__0_0.distcp", SP_ITEM_TENSOR, t->fqn, "float32", t->ndim, t->chunks[0].offsets,
                            t->chunks[0].sizes, is_w ? static_cast<const void*>(w) : static_cast<const void*>(b),
                            is_w ? sizeof w : sizeof b});
  }
  const std::string planned = (dir.path() / "planned").string();
  sp_checkpoint* ckpt = nullptr;
  ASSERT_EQ(sp_checkpoint_open(planned.c_str(), &ckpt, &error), SP_OK) << take(error);
  auto written = sized(&sp_write_result_init);
  ASSERT_EQ(sp_write_items(ckpt, items.data(), items.size(), nullptr, &written, &error), SP_OK) << take(error);
  ASSERT_EQ(written.item_count, 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const sp_written_item& rec = written.items[i];
    const sp_inspect_chunk& chunk = order[i]->chunks[0];
    EXPECT_EQ(rec.kind, SP_ITEM_TENSOR);
    EXPECT_STREQ(rec.fqn, order[i]->fqn);
    ASSERT_EQ(rec.ndim, order[i]->ndim);
    EXPECT_TRUE(std::equal(rec.offsets, rec.offsets + rec.ndim, chunk.offsets));
    EXPECT_STREQ(rec.storage.file, "__0_0.distcp");
    EXPECT_EQ(rec.storage.offset, chunk.storage.offset);
    EXPECT_EQ(rec.storage.length, chunk.storage.length);
    EXPECT_EQ(rec.storage.transform_descriptor_count, 0u);
    EXPECT_EQ(rec.block_count, 1u);  // one 1 MiB block per blob
    EXPECT_NE(rec.checksum, 0u);
    EXPECT_EQ(rec.has_data_offset, 1);
    EXPECT_LT(rec.data_offset, rec.storage.length);
  }

  // A record the library cannot take: nothing committed.
  std::vector<sp_written_item> broken(written.items, written.items + written.item_count);
  broken[0].storage.file = nullptr;
  void* metadata = nullptr;
  size_t metadata_size = 0;
  int found = 0;
  sp_checkpoint* source = nullptr;
  ASSERT_EQ(sp_checkpoint_open(saved.c_str(), &source, &error), SP_OK) << take(error);
  ASSERT_EQ(sp_read_object(source, ".metadata", &metadata, &metadata_size, &found, &error), SP_OK) << take(error);
  sp_checkpoint_close(source);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(sp_commit(ckpt, metadata, metadata_size, broken.data(), broken.size(), nullptr, &error), SP_ERROR_USAGE);
  EXPECT_NE(take(error).find("model."), std::string::npos);
  EXPECT_FALSE(fs::exists(fs::path(planned) / ".metadata"));

  ASSERT_EQ(sp_commit(ckpt, metadata, metadata_size, written.items, written.item_count, nullptr, &error), SP_OK)
      << take(error);
  sp_free(metadata);
  sp_write_result_free(&written);
  EXPECT_EQ(written.owner, nullptr);
  EXPECT_EQ(written.items, nullptr);
  sp_checkpoint_close(ckpt);
  sp_inspect_result_free(&inspected);
  const auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const char* name : {"__0_0.distcp", ".shardpoint-checksums.json", ".metadata"}) {
    EXPECT_EQ(read(fs::path(planned) / name), read(fs::path(saved) / name)) << name;
  }
  auto verified = sized(&sp_verify_result_init);
  ASSERT_EQ(sp_verify(planned.c_str(), nullptr, &verified, &error), SP_OK) << take(error);
  EXPECT_EQ(verified.ok, 1);
  EXPECT_EQ(verified.verified_bytes, verified.bytes);
  sp_verify_result_free(&verified);
}

// A bytes item's record, and a result struct of an older, smaller size: the records are
// the owner's, freed with it; no byte past struct_size is written.
TEST(CApiWriteItems, BytesItemsAndOlderResultStructs) {
  TempDir dir;
  const std::string folder = (dir.path() / "planned").string();
  sp_checkpoint* ckpt = nullptr;
  char* error = nullptr;
  ASSERT_EQ(sp_checkpoint_open(folder.c_str(), &ckpt, &error), SP_OK) << take(error);
  const std::string blob = "a pickled object";
  const sp_item item{"__0_0.distcp", SP_ITEM_BYTES, "epoch", nullptr, 0, nullptr, nullptr, blob.data(), blob.size()};
  sp_save_options options;
  sp_save_options_init(&options);
  options.compression = SP_COMPRESSION_ZSTD;
  auto written = sized(&sp_write_result_init);
  ASSERT_EQ(sp_write_items(ckpt, &item, 1, &options, &written, &error), SP_OK) << take(error);
  ASSERT_EQ(written.item_count, 1u);
  const sp_written_item& rec = written.items[0];
  EXPECT_EQ(rec.kind, SP_ITEM_BYTES);
  EXPECT_STREQ(rec.fqn, "epoch");
  EXPECT_EQ(rec.ndim, 0);
  EXPECT_EQ(rec.has_data_offset, 0);
  EXPECT_EQ(rec.storage.offset, 0u);
  ASSERT_EQ(rec.storage.transform_descriptor_count, 1u);
  EXPECT_STREQ(rec.storage.transform_descriptors[0], "stream.zstd/1");
  sp_write_result_free(&written);

  struct {
    sp_write_result result;
    unsigned char after[8];
  } old;
  std::memset(&old, 0xab, sizeof old);
  old.result.struct_size = offsetof(sp_write_result, item_count);  // knows only the owner
  const sp_item second{"__0_1.distcp", SP_ITEM_BYTES, "step", nullptr, 0, nullptr, nullptr, blob.data(), blob.size()};
  ASSERT_EQ(sp_write_items(ckpt, &second, 1, nullptr, &old.result, &error), SP_OK) << take(error);
  EXPECT_NE(old.result.owner, nullptr);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old);
  for (std::size_t i = offsetof(sp_write_result, item_count); i < sizeof old; ++i) {
    ASSERT_EQ(bytes[i], 0xab) << "byte " << i << " written past struct_size";
  }
  sp_write_result_free(&old.result);
  EXPECT_EQ(old.result.owner, nullptr);
  auto tiny = sized(&sp_write_result_init);
  tiny.struct_size = sizeof(size_t);  // too small to hold what the library allocates
  EXPECT_EQ(sp_write_items(ckpt, &second, 1, nullptr, &tiny, &error), SP_ERROR_USAGE);
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
