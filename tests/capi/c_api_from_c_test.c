/* The C API from C: every function, success and failure, on a temporary folder.
 * Prints one line per check and "N passed, N failed" at the end; exit 1 on any failure. */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */ /* NOLINT(bugprone-reserved-identifier) */

#include <shardpoint/c_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (cond) {                                                         \
      ++passed;                                                         \
    } else {                                                            \
      ++failed;                                                         \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
    }                                                                   \
  } while (0)

static const char* msg(const char* e) { return e ? e : "(no message)"; }

/* PyTorch DCP's path: the items written with sp_write_items (in the order and files sp_save
 * wrote them into `saved`, as inspect shows), their records handed to sp_commit with the
 * `.metadata` of `saved`: a checkpoint that verifies and loads. */
static void test_planned_write(const char* dir, const char* saved) {
  char* error = NULL;
  sp_inspect_result inspected;
  sp_inspect_result_init(&inspected);
  CHECK(sp_inspect(saved, NULL, &inspected, &error) == SP_OK && inspected.tensor_count == 2, "inspect: %s", msg(error));
  if (inspected.tensor_count != 2) return;
  int64_t w[4][5];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) w[i][j] = i * 10 + j;
  double scalar = 2.5;
  const sp_inspect_tensor* t = inspected.tensors; /* model.w, step */
  const int step_first = t[1].chunks[0].storage.offset < t[0].chunks[0].storage.offset;
  sp_item items[2] = {
      {"__0_0.distcp", SP_ITEM_TENSOR, t[0].fqn, "int64", 2, t[0].chunks[0].offsets, t[0].chunks[0].sizes, w, sizeof w},
      {"__0_0.distcp", SP_ITEM_TENSOR, t[1].fqn, "float64", 0, NULL, NULL, &scalar, sizeof scalar},
  };
  if (step_first) {
    sp_item first = items[0];
    items[0] = items[1];
    items[1] = first;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/planned", dir);
  sp_checkpoint *ckpt = NULL, *source = NULL;
  CHECK(sp_checkpoint_open(path, &ckpt, &error) == SP_OK && sp_checkpoint_open(saved, &source, &error) == SP_OK,
        "open: %s", msg(error));
  sp_write_result written;
  sp_write_result_init(&written);
  CHECK(sp_write_items(ckpt, items, 2, NULL, &written, &error) == SP_OK && written.item_count == 2 &&
            written.items[0].kind == SP_ITEM_TENSOR && written.items[0].block_count == 1 &&
            strcmp(written.items[0].storage.file, "__0_0.distcp") == 0,
        "write items: %s", msg(error));
  void* metadata = NULL;
  size_t size = 0;
  int found = 0;
  CHECK(sp_read_object(source, ".metadata", &metadata, &size, &found, &error) == SP_OK && found, "metadata");
  CHECK(sp_commit(ckpt, metadata, size, written.items, written.item_count, NULL, &error) == SP_OK, "commit: %s",
        msg(error));
  sp_free(metadata);
  sp_write_result_free(&written);
  sp_checkpoint_close(source);
  int64_t back[4][5];
  memset(back, 0, sizeof back);
  const int64_t shape[2] = {4, 5}, zero[2] = {0, 0};
  sp_tensor want = {"model.w", "int64", 2, shape, zero, shape, back, sizeof back};
  CHECK(sp_load(ckpt, &want, 1, NULL, &error) == SP_OK && memcmp(back, w, sizeof w) == 0, "load: %s", msg(error));
  sp_checkpoint_close(ckpt);
  sp_verify_result verified;
  sp_verify_result_init(&verified);
  CHECK(sp_verify(path, NULL, &verified, &error) == SP_OK && verified.ok && verified.verified_bytes == verified.bytes &&
            verified.bytes > 0,
        "verify: %s", msg(error));
  sp_verify_result_free(&verified);
  sp_inspect_result_free(&inspected);
}

static void test_save_load_reshard(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  char* error = NULL;
  sp_checkpoint* ckpt = NULL;
  CHECK(sp_checkpoint_open(path, &ckpt, &error) == SP_OK, "open: %s", msg(error));

  int64_t w[4][5];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) w[i][j] = i * 10 + j;
  const int64_t shape[2] = {4, 5}, zero[2] = {0, 0};
  double scalar = 2.5;
  sp_tensor tensors[2] = {
      {"model.w", "int64", 2, shape, zero, shape, w, sizeof w},
      {"step", "float64", 0, NULL, NULL, NULL, &scalar, sizeof scalar},
  };
  CHECK(sp_save(ckpt, tensors, 2, NULL, &error) == SP_OK, "save: %s", msg(error));

  /* Rows 1..3, columns 2..4 of model.w. */
  int64_t box[3][3] = {{0}};
  const int64_t off[2] = {1, 2}, sz[2] = {3, 3};
  double got_scalar = 0;
  sp_tensor want[2] = {
      {"model.w", "int64", 2, shape, off, sz, box, sizeof box},
      {"step", "float64", 0, NULL, NULL, NULL, &got_scalar, sizeof got_scalar},
  };
  CHECK(sp_load(ckpt, want, 2, NULL, &error) == SP_OK, "load: %s", msg(error));
  CHECK(box[0][0] == 12 && box[2][2] == 34, "box %lld %lld", (long long)box[0][0], (long long)box[2][2]);
  CHECK(got_scalar == 2.5, "scalar %g", got_scalar);

  /* A dtype that differs is a plan error naming the tensor. */
  float wrong[3][3];
  sp_tensor bad = {"model.w", "float32", 2, shape, off, sz, wrong, sizeof wrong};
  char* e2 = NULL;
  CHECK(sp_load(ckpt, &bad, 1, NULL, &e2) == SP_ERROR_PLAN, "dtype mismatch: %s", msg(e2));
  CHECK(e2 != NULL && strstr(e2, "model.w") != NULL, "message: %s", msg(e2));
  sp_free(e2);

  /* Objects of the folder. */
  void* data = NULL;
  size_t size = 0;
  int found = 0;
  CHECK(sp_read_object(ckpt, ".metadata", &data, &size, &found, &error) == SP_OK && found && size > 0, "metadata");
  /* The rebuild is stable: rebuilding a rebuild gives the same bytes. */
  void* rebuilt = NULL;
  size_t rebuilt_size = 0;
  CHECK(sp_metadata_rebuild(data, size, "ckpt/.metadata", &rebuilt, &rebuilt_size, &error) == SP_OK && rebuilt_size > 0,
        "rebuild: %s", msg(error));
  void* again = NULL;
  size_t again_size = 0;
  CHECK(sp_metadata_rebuild(rebuilt, rebuilt_size, "rebuilt", &again, &again_size, &error) == SP_OK &&
            again_size == rebuilt_size && memcmp(again, rebuilt, again_size) == 0,
        "rebuild of a rebuild");
  sp_free(again);
  sp_free(rebuilt);
  sp_free(data);
  /* A pickle that calls os.system is refused by name, nothing run. */
  static const char hostile[] = "\x80\x02"
                                "cposix\nsystem\nX\x04\x00\x00\x00"
                                "true\x85R.";
  char* e3 = NULL;
  CHECK(sp_metadata_rebuild(hostile, sizeof hostile - 1, "evil/.metadata", &rebuilt, &rebuilt_size, &e3) ==
                SP_ERROR_FORMAT &&
            e3 != NULL && strstr(e3, "evil/.metadata") && strstr(e3, "posix.system"),
        "hostile metadata: %s", msg(e3));
  sp_free(e3);
  /* The committed checkpoint's data files are never written again. */
  int64_t one_offset = 0, one_size = 1;
  float one = 1;
  sp_item item = {"__0_0.distcp", SP_ITEM_TENSOR, "model.w", "float32", 1, &one_offset, &one_size, &one, sizeof one};
  sp_write_result written;
  sp_write_result_init(&written);
  char* e4 = NULL;
  CHECK(sp_write_items(ckpt, &item, 1, NULL, &written, &e4) == SP_ERROR_USAGE && e4 != NULL &&
            strstr(e4, "committed checkpoint") && written.owner == NULL && written.item_count == 0,
        "write into a committed checkpoint: %s", msg(e4));
  sp_free(e4);
  sp_write_result_free(&written);
  CHECK(sp_read_object(ckpt, "absent", &data, &size, &found, &error) == SP_OK && !found && data == NULL, "absent");
  CHECK(sp_write_object(ckpt, "meta.txt", "hello", 5, 1, &error) == SP_OK, "write_object: %s", msg(error));
  CHECK(sp_read_object(ckpt, "meta.txt", &data, &size, &found, &error) == SP_OK && size == 5 &&
            memcmp(data, "hello", 5) == 0,
        "read back");
  sp_free(data);
  CHECK(sp_remove_object(ckpt, "meta.txt", &error) == SP_OK, "remove");
  sp_checkpoint_close(ckpt);

  /* Tools: inspect, verify, reshard, consolidate. */
  sp_inspect_result inspected;
  sp_inspect_result_init(&inspected);
  CHECK(sp_inspect(path, NULL, &inspected, &error) == SP_OK && inspected.tensor_count == 2 &&
            strcmp(inspected.tensors[0].fqn, "model.w") == 0 && inspected.tensors[0].ndim == 2 &&
            inspected.tensors[0].shape[1] == 5 && strcmp(inspected.tensors[0].dtype, "int64") == 0 &&
            inspected.tensors[1].ndim == 0 && inspected.tensors[1].chunk_count == 1 &&
            inspected.sidecar == SP_CHECKSUM_CRC32C && inspected.format == SP_CHECKPOINT_DCP &&
            strcmp(sp_name_of_value(SP_NAME_CHECKPOINT_FORMAT, inspected.format), "dcp") == 0,
        "inspect: %s", msg(error));
  sp_inspect_result_free(&inspected);
  test_planned_write(dir, path);
  sp_verify_result verified;
  sp_verify_result_init(&verified);
  CHECK(sp_verify(path, NULL, &verified, &error) == SP_OK && verified.ok && verified.problem_count == 0 &&
            verified.coverage_count >= 1 && verified.coverage[0].sidecar == SP_CHECKSUM_CRC32C,
        "verify: %s", msg(error));
  sp_verify_result_free(&verified);
  char dst[4096];
  snprintf(dst, sizeof dst, "%s/three", dir);
  sp_reshard_result resharded;
  sp_reshard_result_init(&resharded);
  CHECK(sp_reshard(path, dst, 3, NULL, &resharded, &error) == SP_OK && resharded.tensors == 2 &&
            resharded.source_format == SP_CHECKPOINT_DCP && resharded.zip_crc.records_checked == 0,
        "reshard: %s", msg(error)); /* the sidecar covers every blob */
  char out[4096];
  snprintf(out, sizeof out, "%s/model.pt", dir);
  sp_consolidate_options options;
  sp_consolidate_options_init(&options);
  options.output_file = out;
  options.layout = SP_LAYOUT_DCP;
  sp_consolidate_result consolidated;
  sp_consolidate_result_init(&consolidated);
  CHECK(sp_consolidate(dst, &options, &consolidated, &error) == SP_OK && strstr(consolidated.output, "model.pt") &&
            consolidated.zip_crc.records_partial == 0,
        "consolidate: %s", msg(error));
  sp_consolidate_result_free(&consolidated);
}

/* A zstd save (sp_save_options.compression): .metadata records "stream.zstd/1" for every
 * item (inspect says so), and a load reads the values back; sp_reshard compresses too. */
static void test_zstd(const char* dir) {
  char path[4096], dst[4096];
  snprintf(path, sizeof path, "%s/zstd", dir);
  snprintf(dst, sizeof dst, "%s/zstd-r2", dir);
  char* error = NULL;
  sp_checkpoint* ckpt = NULL;
  CHECK(sp_checkpoint_open(path, &ckpt, &error) == SP_OK, "open: %s", msg(error));
  float w[64][32];
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 32; ++j) w[i][j] = (float)(i * 32 + j) * 0.25f;
  const int64_t shape[2] = {64, 32}, zero[2] = {0, 0};
  sp_tensor t = {"w", "float32", 2, shape, zero, shape, w, sizeof w};
  sp_save_options options;
  sp_save_options_init(&options);
  CHECK(options.compression == SP_COMPRESSION_NONE && options.compression_level == 3, "defaults");
  options.compression = SP_COMPRESSION_ZSTD;
  CHECK(sp_save(ckpt, &t, 1, &options, &error) == SP_OK, "zstd save: %s", msg(error));
  float back[64][32];
  memset(back, 0, sizeof back);
  sp_tensor want = {"w", "float32", 2, shape, zero, shape, back, sizeof back};
  CHECK(sp_load(ckpt, &want, 1, NULL, &error) == SP_OK, "zstd load: %s", msg(error));
  CHECK(memcmp(back, w, sizeof w) == 0, "zstd values");
  sp_inspect_options inspect_options;
  sp_inspect_options_init(&inspect_options);
  sp_inspect_result inspected;
  sp_inspect_result_init(&inspected);
  CHECK(sp_inspect(path, &inspect_options, &inspected, &error) == SP_OK && inspected.tensor_count == 1 &&
            inspected.tensors[0].chunks[0].storage.transform_descriptor_count == 1 &&
            strcmp(inspected.tensors[0].chunks[0].storage.transform_descriptors[0], "stream.zstd/1") == 0,
        "inspect: %s", msg(error));
  sp_inspect_result_free(&inspected);
  sp_reshard_options reshard_options;
  sp_reshard_options_init(&reshard_options);
  reshard_options.compression = SP_COMPRESSION_ZSTD;
  sp_reshard_result resharded;
  sp_reshard_result_init(&resharded);
  CHECK(sp_reshard(path, dst, 2, &reshard_options, &resharded, &error) == SP_OK, "reshard: %s", msg(error));
  CHECK(sp_inspect(dst, NULL, &inspected, &error) == SP_OK && inspected.tensor_count == 1 &&
            inspected.tensors[0].chunk_count == 2 && inspected.file_count == 2 &&
            strcmp(inspected.tensors[0].chunks[1].storage.transform_descriptors[0], "stream.zstd/1") == 0,
        "resharded: %s", msg(error));
  sp_inspect_result_free(&inspected);
  options.compression = 7;
  CHECK(sp_save(ckpt, &t, 1, &options, &error) == SP_ERROR_USAGE, "unknown compression");
  sp_free(error);
  sp_checkpoint_close(ckpt);
}

static void test_errors(const char* dir) {
  char* error = NULL;
  sp_checkpoint* ckpt = NULL;
  CHECK(sp_checkpoint_open("nosuch://x/y", &ckpt, &error) == SP_ERROR_USAGE, "unknown scheme");
  CHECK(error != NULL && strstr(error, "nosuch") != NULL, "message: %s", msg(error));
  sp_free(error);
  error = NULL;

  char path[4096];
  snprintf(path, sizeof path, "%s/empty", dir);
  CHECK(sp_checkpoint_open(path, &ckpt, &error) == SP_OK, "open empty");
  sp_reader* reader = NULL;
  CHECK(sp_reader_open(ckpt, NULL, &reader, &error) == SP_ERROR_NOT_FOUND, "reader on nothing");
  CHECK(error != NULL && strstr(error, "not a committed checkpoint") != NULL, "message: %s", msg(error));
  sp_free(error);
  error = NULL;
  CHECK(sp_verify(path, NULL, NULL, &error) == SP_ERROR_USAGE, "NULL out");
  sp_free(error);
  sp_checkpoint_close(ckpt);
  CHECK(strlen(sp_version()) >= 5, "version");
}

/* The files a rank writes: as asked on local folders and S3, at least 4 on gs:// (one
 * resumable session per object is one sequential stream). Opening URLs does no I/O. */
static void test_location_parse(void) {
  int remote = -1;
  char *canonical = NULL, *parent = NULL, *name = NULL, *error = NULL;
  CHECK(sp_location_parse("file://localhost/data/./ckpt/", &remote, &canonical, &parent, &name, &error) == SP_OK &&
            remote == 0 && strcmp(canonical, "/data/ckpt") == 0 && strcmp(parent, "/data") == 0 &&
            strcmp(name, "ckpt") == 0,
        "file URL: %s %s %s", msg(canonical), msg(parent), msg(name));
  sp_free(canonical);
  sp_free(parent);
  sp_free(name);
  CHECK(sp_location_parse("S3://bucket/run/step-3", &remote, &canonical, &parent, &name, &error) == SP_OK &&
            remote == 1 && strcmp(canonical, "s3://bucket/run/step-3") == 0 && strcmp(parent, "s3://bucket/run") == 0 &&
            strcmp(name, "step-3") == 0,
        "s3 URL: %s %s %s", msg(canonical), msg(parent), msg(name));
  sp_free(canonical);
  sp_free(parent);
  sp_free(name);
  CHECK(sp_location_parse("file://other/x", &remote, &canonical, &parent, &name, &error) == SP_ERROR_USAGE &&
            error != NULL,
        "file URL of another host: %s", msg(error));
  sp_free(error);
}

static void test_files_per_rank(const char* dir) {
  char* error = NULL;
  sp_checkpoint* ckpt = NULL;
  CHECK(sp_checkpoint_open(dir, &ckpt, &error) == SP_OK, "open: %s", msg(error));
  CHECK(sp_checkpoint_files_per_rank(ckpt, 1) == 1 && sp_checkpoint_files_per_rank(ckpt, 3) == 3, "local");
  CHECK(sp_checkpoint_files_per_rank(ckpt, 0) == 1, "local, 0 asked");
  sp_checkpoint_close(ckpt);
  /* Every object store: gs:// on the JSON API (resumable sessions, an OAuth token) and on
   * the XML API (S3's multipart, HMAC keys), s3://. */
  unsetenv("GCS_HMAC_ACCESS_ID");
  unsetenv("GCS_HMAC_SECRET");
  setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "test-token", 1);
  CHECK(sp_checkpoint_open("gs://bucket/prefix", &ckpt, &error) == SP_OK, "open gs: %s", msg(error));
  CHECK(sp_checkpoint_files_per_rank(ckpt, 1) == 4 && sp_checkpoint_files_per_rank(ckpt, 6) == 6, "gs JSON");
  sp_checkpoint_close(ckpt);
  unsetenv("GOOGLE_OAUTH_ACCESS_TOKEN");
  setenv("GCS_HMAC_ACCESS_ID", "id", 1);
  setenv("GCS_HMAC_SECRET", "secret", 1);
  CHECK(sp_checkpoint_open("gs://bucket/prefix", &ckpt, &error) == SP_OK, "open gs: %s", msg(error));
  CHECK(sp_checkpoint_files_per_rank(ckpt, 1) == 4 && sp_checkpoint_files_per_rank(ckpt, 5) == 5, "gs XML");
  sp_checkpoint_close(ckpt);
  unsetenv("GCS_HMAC_ACCESS_ID");
  unsetenv("GCS_HMAC_SECRET");
  CHECK(sp_checkpoint_open("s3://bucket/prefix", &ckpt, &error) == SP_OK, "open s3: %s", msg(error));
  CHECK(sp_checkpoint_files_per_rank(ckpt, 1) == 4, "s3");
  sp_checkpoint_close(ckpt);
  CHECK(sp_checkpoint_files_per_rank(NULL, 2) == 2, "NULL");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_test TEMP_DIR\n");
    return 2;
  }
  test_save_load_reshard(argv[1]);
  test_zstd(argv[1]);
  test_errors(argv[1]);
  test_files_per_rank(argv[1]);
  test_location_parse();
  printf("c_api_test: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
