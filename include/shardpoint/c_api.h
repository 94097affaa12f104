/* shardpoint C API: the stable ABI of libshardpoint for other languages (the Python
 * package binds to it) and for C programs.
 *
 * Conventions, for every function:
 *  - The return value is an sp_status: SP_OK (0) on success, else the kind of error. When
 *    `error` is not NULL and the call fails, *error receives a malloc'd, NUL-terminated
 *    one-line message (the engine's, naming the file, item and what was expected); the
 *    caller frees it with sp_free(). On success *error is left unchanged.
 *  - Buffers the library returns (`void** data`, `char** json`) are malloc'd; the caller
 *    frees them with sp_free(). Buffers the caller passes are borrowed for the call only.
 *  - No exception, signal or abort crosses this boundary for a failure of the request.
 *  - Strings are UTF-8. JSON results are objects documented per function.
 *  - Options structs begin with `struct_size`; call the matching *_init() first, then set
 *    fields, so a program built against an older header keeps working with a newer library.
 *
 * Thread-safety: functions on different handles may run concurrently. One sp_checkpoint
 * or sp_reader may be used from several threads at once. Blocking calls block only the
 * calling thread (language bindings may release their interpreter lock around them).
 *
 * The checkpoint format is PyTorch's distributed checkpoint (DCP): a folder or object-store
 * prefix with `__<rank>_<n>.distcp` data files and the `.metadata` pickle, plus the
 * checksum sidecar and load index shardpoint adds (docs/ARCHITECTURE.md).
 */
#ifndef SHARDPOINT_C_API_H_
#define SHARDPOINT_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SP_EXPORT
#else
#define SP_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds of failure. Existing values never change. */
typedef enum sp_status {
  SP_OK = 0,
  SP_ERROR_FORMAT = 1,    /* bytes are not what the format says (corrupt, truncated, checksum) */
  SP_ERROR_STORAGE = 2,   /* I/O, permission, full disk, network */
  SP_ERROR_NOT_FOUND = 3, /* a missing object, folder or committed checkpoint */
  SP_ERROR_PLAN = 4,      /* the checkpoint cannot satisfy the request (keys, shapes) */
  SP_ERROR_USAGE = 5,     /* invalid arguments */
  SP_ERROR_COMM = 6,      /* communication between ranks */
  SP_ERROR_INTERNAL = 7   /* a bug; the message says where */
} sp_status;

/* The library's version, "MAJOR.MINOR.PATCH". Static storage; never NULL. */
SP_EXPORT const char* sp_version(void);

/* Frees a buffer the library returned. NULL is ignored. */
SP_EXPORT void sp_free(void* p);

/* A path or URL parsed by the engine's one location parser, with the rules every command
 * and call uses: "<scheme>://" URLs are remote except file:// ("file:///abs" and
 * "file://localhost/abs" are the local path "/abs"); paths are normalised as pathlib does.
 * *remote: 1 for an object store or memory:// URL, 0 for a local path. *canonical: the
 * location's text (a local location's is its path); *parent: the folder or prefix holding
 * it ("" when there is none: a bucket root, "/", "."); *name: its last segment ("" when
 * none). The three strings are malloc'd (free with sp_free). Errors: SP_ERROR_USAGE for a
 * file:// URL naming another host or carrying a query. */
SP_EXPORT sp_status sp_location_parse(const char* path_or_url, int* remote, char** canonical, char** parent,
                                      char** name, char** error);

/* ------------------------------------------------------------------------------------ */
/* Checkpoint locations                                                                  */

/* A checkpoint location: a local folder or an object-store prefix (s3://bucket/prefix,
 * gs://bucket/prefix, az://container/prefix), with the same credential variables as the
 * shardpoint CLI (`shardpoint verify --help`). */
typedef struct sp_checkpoint sp_checkpoint;

/* Opens `path_or_url`. A local folder is created on the first write; opening does no I/O
 * on object stores. *out receives the handle (free with sp_checkpoint_close).
 * Errors: SP_ERROR_USAGE for an unknown scheme or malformed URL. */
SP_EXPORT sp_status sp_checkpoint_open(const char* path_or_url, sp_checkpoint** out, char** error);
SP_EXPORT void sp_checkpoint_close(sp_checkpoint* checkpoint);

/* The whole object `key` ("meta.pt", ".metadata") inside the location. *found = 0 and
 * *data = NULL when there is none (not an error). */
SP_EXPORT sp_status sp_read_object(sp_checkpoint* checkpoint, const char* key, void** data, size_t* size, int* found,
                                   char** error);

/* Publishes `size` bytes under `key` atomically: readers see the old object or the new
 * one, never a part (local: tmp + fsync + rename + directory fsync when durable). */
SP_EXPORT sp_status sp_write_object(sp_checkpoint* checkpoint, const char* key, const void* data, size_t size,
                                    int durable, char** error);

/* Removes `key`; a missing object is not an error. */
SP_EXPORT sp_status sp_remove_object(sp_checkpoint* checkpoint, const char* key, char** error);

/* The data files a rank's save should write, in parallel, when asked for `thread_count`
 * (>= 1): `thread_count` itself, raised to 4 where the location's storage uploads an object
 * as one sequence of requests (gs:// on the JSON API), where one object per rank would be
 * one upload stream per rank. sp_save decides so by itself; callers that plan the files
 * (PyTorch DCP through sp_write_items) ask here. No I/O; thread-safe. */
SP_EXPORT int sp_checkpoint_files_per_rank(const sp_checkpoint* checkpoint, int thread_count);

/* ------------------------------------------------------------------------------------ */
/* Options                                                                               */

typedef enum sp_checksum { SP_CHECKSUM_NONE = 0, SP_CHECKSUM_CRC32C = 1, SP_CHECKSUM_XXH3 = 2 } sp_checksum;

/* How saves store each item (docs/dcp-format.md §2.4): as is, or one zstd frame recorded as
 * PyTorch's ZStandard extension records it ("stream.zstd/1"; PyTorch >= 2.7 reads it). */
typedef enum sp_compression { SP_COMPRESSION_NONE = 0, SP_COMPRESSION_ZSTD = 1 } sp_compression;

/* How saves write. */
typedef struct sp_save_options {
  size_t struct_size;
  int thread_count;              /* files written in parallel; default 1 */
  int checksum;                  /* sp_checksum; default SP_CHECKSUM_CRC32C */
  uint64_t checksum_block_bytes; /* default 1 MiB */
  int durable;                   /* fsync files and folder before commit; default 1 */
  int direct_io;                 /* O_DIRECT for data files where supported; default 1 */
  int compression;               /* sp_compression; default SP_COMPRESSION_NONE */
  int compression_level;         /* zstd level 1..19; default 3 (PyTorch's) */
  /* Threads compressing a rank's zstd items at once (SaveOptions::compression_threads);
   * 0 (default): one per hardware thread; 1: none beyond the file threads. */
  int compression_threads;
} sp_save_options;
SP_EXPORT void sp_save_options_init(sp_save_options* options);

/* How loads read. */
typedef struct sp_reader_options {
  size_t struct_size;
  int verify_checksums; /* verify against the sidecar when the checkpoint has one; default 1 */
  int thread_count;     /* blobs read in parallel; default 4 */
  /* Where no sidecar covers a blob (PyTorch's checkpoints), check the zip CRC-32 of every
   * record read whole (a mismatch is SP_ERROR_FORMAT naming file, item, record and byte
   * range); only with verify_checksums. Default 1. */
  int check_zip_crc;
} sp_reader_options;
SP_EXPORT void sp_reader_options_init(sp_reader_options* options);

/* ------------------------------------------------------------------------------------ */
/* Saving and loading tensors                                                            */

/* One tensor of the state: this process's box [offsets, offsets + sizes) of the global
 * tensor `global_shape`, row-major in `data` (product(sizes) * itemsize bytes = nbytes).
 * dtype: a PyTorch dtype name without "torch." ("float32", "bfloat16", "int64", ...). */
typedef struct sp_tensor {
  const char* fqn;
  const char* dtype;
  int ndim;
  const int64_t* global_shape;
  const int64_t* offsets;
  const int64_t* sizes;
  void* data;
  uint64_t nbytes;
} sp_tensor;

/* Saves the tensors into the checkpoint location as a DCP checkpoint (every process of the
 * job calls it with its own boxes; `.metadata` is committed when all have written). The
 * job is this process alone, or, when the environment says so, the ranks of a torchrun
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: TCP) or mpirun job. `options` may be NULL. */
SP_EXPORT sp_status sp_save(sp_checkpoint* checkpoint, const sp_tensor* tensors, size_t count,
                            const sp_save_options* options, char** error);

/* Fills each tensor's `data` with its box, read from the checkpoint whatever the boxes it
 * was saved in (resharding), verified against the checksums when the checkpoint has them.
 * Same job rules as sp_save. Errors: SP_ERROR_NOT_FOUND without a committed checkpoint,
 * SP_ERROR_PLAN for a missing key or a dtype/shape mismatch (naming all of them),
 * SP_ERROR_FORMAT for damaged data. On failure the buffers may be partly written. */
SP_EXPORT sp_status sp_load(sp_checkpoint* checkpoint, const sp_tensor* tensors, size_t count,
                            const sp_reader_options* options, char** error);

/* Publishes the local folder `staged` (a checkpoint written beside `target`) as `target`:
 * renamed into place when `target` is absent, else exchanged with it in one step
 * (renameat2 RENAME_EXCHANGE) and the old folder removed, so a committed checkpoint under
 * `target` is replaced without a moment where neither the old nor the new one is there.
 * Local paths only (SP_ERROR_USAGE for URLs); both on one filesystem. */
SP_EXPORT sp_status sp_replace_folder(const char* staged, const char* target, int durable, char** error);

/* ------------------------------------------------------------------------------------ */
/* Saving a plan made elsewhere (PyTorch DCP's planner)                                  */

typedef enum sp_item_kind { SP_ITEM_TENSOR = 0, SP_ITEM_BYTES = 1 } sp_item_kind;

/* One item of a data file. Tensors: `data` holds the chunk's row-major bytes
 * (product(sizes) * itemsize of dtype), `dtype` a PyTorch dtype name without the "torch."
 * prefix ("float32", "bfloat16", ...), `offsets` the chunk's global offsets. Bytes items:
 * `data` is the serialized blob, written verbatim; ndim, offsets, sizes, dtype unused. */
typedef struct sp_item {
  const char* file; /* "__0_0.distcp": items of one file are written in the order given */
  int kind;         /* sp_item_kind */
  const char* fqn;
  const char* dtype;
  int ndim;
  const int64_t* offsets;
  const int64_t* sizes;
  const void* data;
  uint64_t nbytes;
} sp_item;

/* Writes the data files the items name (each file once, published when complete) and sets
 * *written_json to a JSON array with one object per item, in file order:
 *   {"index": {"fqn": str, "offset": [int] | null, "index": null}, "file": str,
 *    "offset": int, "length": int, "transform_descriptors": [str]?, "checksum": int,
 *    "blocks": [int], "data_offset": int?}
 * (offset/length: the item's blob inside the file as stored; transform_descriptors: what
 * .metadata must record for a compressed item). On failure the files written by this
 * call are removed again. Blocks; tensor bytes are read straight from `data`. */
SP_EXPORT sp_status sp_write_items(sp_checkpoint* checkpoint, const sp_item* items, size_t count,
                                   const sp_save_options* options, char** written_json, char** error);

/* Commits the checkpoint (the coordinator, once every rank wrote its files): the checksum
 * sidecar from `written_json` (a JSON array of the written items of every rank, as
 * sp_write_items returns them), the load index, then `.metadata` = `metadata` (the
 * metadata pickle, naming every item) atomically. Nothing is committed on failure. */
SP_EXPORT sp_status sp_commit(sp_checkpoint* checkpoint, const void* metadata, size_t metadata_size,
                              const char* written_json, const sp_save_options* options, char** error);

/* ------------------------------------------------------------------------------------ */
/* Reading what a plan made elsewhere names                                              */

typedef struct sp_reader sp_reader;

/* Opens a committed checkpoint: reads `.metadata` and the checksums. Errors:
 * SP_ERROR_NOT_FOUND without `.metadata`; SP_ERROR_FORMAT for a damaged sidecar. */
SP_EXPORT sp_status sp_reader_open(sp_checkpoint* checkpoint, const sp_reader_options* options, sp_reader** out,
                                   char** error);
SP_EXPORT void sp_reader_close(sp_reader* reader);

/* The `.metadata` bytes the reader opened (borrowed: valid until sp_reader_close). */
SP_EXPORT void sp_reader_metadata(const sp_reader* reader, const void** data, size_t* size);

/* The reader's metadata as a pickle safe to unpickle: the `.metadata` decoded by the engine
 * (nothing in it is executed; anything that is not DCP metadata is refused) and encoded
 * again (docs/dcp-format.md §3.7), so it names only DCP's metadata classes, `_StorageInfo`,
 * `torch.Size`, torch dtypes and the strided layout. Dropped: `storage_meta`, `version` and
 * planner_data that is not a tuple of keys per fqn (loads need none of them). *data is
 * malloc'd (free with sp_free). Errors: SP_ERROR_FORMAT naming the `.metadata` and what it
 * holds instead (e.g. "the pickle's root: expected Metadata, found call of posix.system"). */
SP_EXPORT sp_status sp_reader_metadata_rebuilt(const sp_reader* reader, void** data, size_t* size, char** error);

/* The same for `.metadata` bytes the caller holds; `source_name` starts error messages. */
SP_EXPORT sp_status sp_metadata_rebuild(const void* metadata, size_t metadata_size, const char* source_name,
                                        void** data, size_t* size, char** error);

/* 1 when reads are verified against checksums, 0 when the checkpoint has none (PyTorch's
 * own) or verification is off. */
SP_EXPORT int sp_reader_verified(const sp_reader* reader);

/* 1 when blobs no sidecar covers have their zip CRC-32s checked (sp_reader_options). */
SP_EXPORT int sp_reader_checks_zip_crc(const sp_reader* reader);

/* The zip CRC-32 checks of the reads so far: records whose CRC-32 matched, records read
 * only in part (a resharding read: not checked), records written without a CRC-32. Any
 * pointer may be NULL. */
SP_EXPORT void sp_reader_zip_crc_counts(const sp_reader* reader, uint64_t* records_checked, uint64_t* records_partial,
                                        uint64_t* records_no_checksum);

/* One tensor read: the box [storage_offsets, storage_offsets + lengths) of the saved chunk
 * (global `chunk_offsets`, `chunk_sizes`) whose blob is [blob_offset, blob_offset +
 * blob_length) of `file`, into `dest`: the row-major box of `lengths`, dest_nbytes bytes. */
typedef struct sp_tensor_read {
  const char* file;
  uint64_t blob_offset;
  uint64_t blob_length;
  const char* fqn;
  const char* dtype;
  int ndim;
  const int64_t* chunk_offsets;
  const int64_t* chunk_sizes;
  const int64_t* storage_offsets;
  const int64_t* lengths;
  void* dest;
  uint64_t dest_nbytes;
} sp_tensor_read;

/* Reads every request (in parallel, each blob's headers parsed once), verified when
 * sp_reader_verified(). On failure destinations may be partly written. */
SP_EXPORT sp_status sp_reader_read_tensors(sp_reader* reader, const sp_tensor_read* reads, size_t count, char** error);

/* The whole blob [offset, offset + length) of `file` (a bytes item), verified against its
 * item checksum when sp_reader_verified(); decompressed when `.metadata` records a stream
 * transform for the item at that file and offset (as are sp_reader_read_tensors' blobs). */
SP_EXPORT sp_status sp_reader_read_blob(sp_reader* reader, const char* file, uint64_t offset, uint64_t length,
                                        const char* fqn, void** data, size_t* size, char** error);

/* ------------------------------------------------------------------------------------ */
/* Tools (what the CLI does), options and results as JSON objects                         */

/* Lightning's consolidate_checkpoint, streaming. options_json (may be NULL):
 *   {"output_file": str, "layout": "trainer"|"fabric"|"dcp",
 *    "format": "torch"|"safetensors"|"hf-safetensors" (hf-safetensors: Hugging Face's folder,
 *    model-0000i-of-0000N.safetensors + model.safetensors.index.json), "max_shard_bytes": int,
 *    "memory_budget": int, "verify_checksums": bool, "check_zip_crc": bool,
 *    "durable": bool}
 * *report_json: {"output", "tensors", "objects", "tensor_bytes", "bytes_read", "peak_rss_bytes",
 * "zip_crc", "seconds"}, where "zip_crc" counts the zip CRC-32 checks of the blobs no sidecar
 * covers and of meta.pt: {"records_checked", "bytes_checked", "records_no_checksum",
 * "records_partial"} (no_checksum and partial: records not checked). */
SP_EXPORT sp_status sp_consolidate(const char* checkpoint_folder, const char* options_json, char** report_json,
                                   char** error);

/* Rewrites any checkpoint (DCP or Hugging Face safetensors folder, or torch.save file) as a
 * DCP folder saved by `ranks`
 * ranks. options_json (may be NULL): {"verify_checksums": bool, "check_zip_crc": bool, "memory_budget": int,
 * "thread_count": int, "durable": bool, "checksum": "crc32c"|"xxh3"|"none", "compression": "none"|"zstd",
 * "compression_level": int, "compression_threads": int}.
 * *report_json: {"source_format" ("dcp"|"hf-safetensors"|"torch"), "tensors", "objects",
 * "payload_bytes", "bytes_written", "zip_crc", "meta_pt_bytes", "seconds"}, "zip_crc" as in
 * sp_consolidate's report; "meta_pt_bytes": the size of Lightning's meta.pt carried over (0:
 * the source has none). */
SP_EXPORT sp_status sp_reshard(const char* source, const char* destination, int ranks, const char* options_json,
                               char** report_json, char** error);

/* The structure of a checkpoint folder (DCP or Hugging Face safetensors) without reading
 * tensor data: {"format": "dcp"|"hf-safetensors", "tensors": {fqn: {"dtype", "shape", "chunks": [{"offsets", "sizes",
 *   "file", "offset", "length", "transform_descriptors"?}]}}, "objects": {fqn: {"file",
 *   "offset", "length", "transform_descriptors"?}},
 *  "files": [str], "checksums": "crc32c"|"xxh3"|null}. */
SP_EXPORT sp_status sp_inspect(const char* path_or_url, char** json, char** error);

/* Checks a checkpoint (a DCP folder or URL, or a torch.save file): files present, chunks
 * tile each tensor, every blob parses, the sidecar's CRC-32C blocks and every zip record's
 * CRC-32 match. options_json (may be NULL): {"quick": bool} (structure only: no tensor data
 * read, no checksum checked). *report_json:
 *   {"ok": bool, "problems": [{"file", "item", "message"}], "tensors", "objects",
 *    "bytes" (data read), "verified_bytes" (of those, covered by a checksum that matched),
 *    "coverage": [{"name", "format": "dcp"|"torch", "quick", "structure_bytes",
 *      "zip_records", "zip_record_bytes", "zip_crc32_bytes", "no_checksum_bytes",
 *      "sidecar": "crc32c"|"xxh3"|null, "sidecar_bytes"}]}
 * A damaged checkpoint returns SP_OK with "ok": false; errors are for checkpoints that
 * cannot be found or opened at all (SP_ERROR_NOT_FOUND, SP_ERROR_STORAGE). */
SP_EXPORT sp_status sp_verify(const char* path_or_url, const char* options_json, char** report_json, char** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDPOINT_C_API_H_ */
