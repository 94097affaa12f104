/* shardpoint C API: the stable ABI of libshardpoint for other languages (the Python
 * package binds to it) and for C programs.
 *
 * Conventions, for every function:
 *  - The return value is an sp_status: SP_OK (0) on success, else the kind of error. When
 *    `error` is not NULL and the call fails, *error receives a malloc'd, NUL-terminated
 *    one-line message (the engine's, naming the file, item and what was expected); the
 *    caller frees it with sp_free(). On success *error is left unchanged.
 *  - Buffers the library returns (`void** data`, `char** text`) are malloc'd; the caller
 *    frees them with sp_free(). Buffers the caller passes are borrowed for the call only.
 *  - No exception, signal or abort crosses this boundary for a failure of the request.
 *  - Strings are UTF-8. Results are structs, never JSON (JSON is the CLI's `--json` output
 *    only); kinds are enums, named by sp_name_of_value().
 *  - Options structs begin with `struct_size`; call the matching *_init() first, then set
 *    fields, so a program built against an older header keeps working with a newer library.
 *    Result structs begin with `struct_size` too (see "Tools" below). The elements of arrays
 *    (sp_item, sp_written_item, ...) are not versioned: a new field means a new struct.
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
 * (>= 1): `thread_count` itself, raised to 4 on object stores (s3://, az://, gs://), where
 * one object per rank would be one upload stream and one object to read per rank.
 * sp_save decides so by itself, and sp_split_into_files for
 * callers that plan the files (PyTorch DCP through sp_write_items). No I/O; thread-safe. */
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

/* Where an item's blob lies (DCP's _StorageInfo): `file` inside the checkpoint ("__0_0.distcp"),
 * the bytes [offset, offset + length) of it as stored, and the transforms `.metadata` records
 * for the blob (PyTorch >= 2.7's transform_descriptors: "stream.zstd/1" for a zstd frame;
 * none for a blob stored as is). */
typedef struct sp_storage_info {
  const char* file;
  uint64_t offset;
  uint64_t length;
  size_t transform_descriptor_count;
  const char* const* transform_descriptors;
} sp_storage_info;

/* What one item became in its file: what the coordinator's sp_commit needs of it (the
 * checksum sidecar's entry and the load index's data offset). */
typedef struct sp_written_item {
  int kind; /* sp_item_kind */
  const char* fqn;
  int ndim;               /* tensors: the chunk's dimensions (0 for a scalar); bytes items: 0 */
  const int64_t* offsets; /* tensors: the chunk's global offsets, ndim of them; bytes items: unused */
  sp_storage_info storage;
  uint64_t checksum; /* over the whole blob as stored; 0 with SP_CHECKSUM_NONE */
  size_t block_count;
  const uint64_t* blocks; /* the checksum of each checksum_block_bytes piece of the blob */
  int has_data_offset;    /* 1: data_offset is set (a tensor item stored uncompressed) */
  uint64_t data_offset;   /* where the tensor bytes start inside the blob */
} sp_written_item;

/* What sp_write_items wrote. Results follow the rules of "Tools" below (struct_size, _init,
 * _free). */
typedef struct sp_write_result {
  size_t struct_size;
  void* owner; /* the library's; what the pointers below point into (sp_write_result_free) */
  size_t item_count;
  const sp_written_item* items; /* one per item, in file order (each file in write order) */
} sp_write_result;
SP_EXPORT void sp_write_result_init(sp_write_result* result);
/* Frees what the result holds (its owner) and sets its pointers to NULL. */
SP_EXPORT void sp_write_result_free(sp_write_result* result);

/* Writes the data files the items name (each file once, published when complete) and fills
 * *result with what each item became. On failure the files written by this call are
 * removed again and *result holds nothing. Blocks; tensor bytes are read straight from
 * `data`. */
SP_EXPORT sp_status sp_write_items(sp_checkpoint* checkpoint, const sp_item* items, size_t count,
                                   const sp_save_options* options, sp_write_result* result, char** error);

/* Commits the checkpoint (the coordinator, once every rank wrote its files): the checksum
 * sidecar from `written` (the written items of every rank, as sp_write_items returned
 * them, in any order of ranks), the load index, then `.metadata` = `metadata` (the metadata
 * pickle, naming every item) atomically. Nothing is committed on failure. */
SP_EXPORT sp_status sp_commit(sp_checkpoint* checkpoint, const void* metadata, size_t metadata_size,
                              const sp_written_item* written, size_t written_count, const sp_save_options* options,
                              char** error);

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
/* Names of the option and result enums                                                  */

/* The enums whose values have names (the CLI's flag values, the names Python passes). */
typedef enum sp_name_kind {
  SP_NAME_CHECKSUM = 0,         /* sp_checksum: "none", "crc32c", "xxh3" */
  SP_NAME_COMPRESSION = 1,      /* sp_compression: "none", "zstd" */
  SP_NAME_LAYOUT = 2,           /* sp_consolidate_layout: "trainer", "fabric", "dcp" */
  SP_NAME_OUTPUT_FORMAT = 3,    /* sp_consolidate_format: "torch", "safetensors", "hf-safetensors" */
  SP_NAME_CHECKPOINT_FORMAT = 4 /* sp_checkpoint_format: "dcp", "hf-safetensors", "torch" */
} sp_name_kind;

/* *value: the enum value named `name` (the engine's one mapping, the CLI's too). Errors:
 * SP_ERROR_USAGE naming the accepted names. */
SP_EXPORT sp_status sp_value_of_name(sp_name_kind kind, const char* name, int* value, char** error);

/* The name of `value` (static storage), or NULL for a value the kind does not have. */
SP_EXPORT const char* sp_name_of_value(sp_name_kind kind, int value);

/* ------------------------------------------------------------------------------------ */
/* Tools (what the CLI does)                                                             */
/*                                                                                       */
/* Options structs begin with struct_size, as the save options (call the *_init first).  */
/* Result structs begin with struct_size too: their *_init zeroes the struct and sets     */
/* struct_size to its size in the header the caller was built with; the library writes   */
/* only that many bytes, so a caller built against an older, smaller struct keeps        */
/* working. A result that holds strings or arrays is released with its *_free (also after */
/* a failure: then it holds nothing). The enums' existing values never change.           */

/* How consolidate arranges the output (Lightning's layouts) and what it writes. */
typedef enum sp_consolidate_layout {
  SP_LAYOUT_TRAINER = 0,
  SP_LAYOUT_FABRIC = 1,
  SP_LAYOUT_DCP = 2
} sp_consolidate_layout;
/* SP_FORMAT_HF_SAFETENSORS: always Hugging Face's folder (model-0000i-of-0000N.safetensors +
 * model.safetensors.index.json); SP_FORMAT_SAFETENSORS: one file unless max_shard_bytes. */
typedef enum sp_consolidate_format {
  SP_FORMAT_TORCH = 0,
  SP_FORMAT_SAFETENSORS = 1,
  SP_FORMAT_HF_SAFETENSORS = 2
} sp_consolidate_format;

/* What a checkpoint is (results). Existing values never change. */
typedef enum sp_checkpoint_format {
  SP_CHECKPOINT_DCP = 0,
  SP_CHECKPOINT_HF_SAFETENSORS = 1,
  SP_CHECKPOINT_TORCH = 2
} sp_checkpoint_format;

/* The zip CRC-32 checks of blobs no sidecar covers, and of meta.pt: records and bytes
 * checked; records not checked: written without a CRC-32, or read only in part. */
typedef struct sp_zip_crc_counts {
  uint64_t records_checked;
  uint64_t bytes_checked;
  uint64_t records_no_checksum;
  uint64_t records_partial;
} sp_zip_crc_counts;

typedef struct sp_consolidate_options {
  size_t struct_size;
  const char* output_file;      /* path or URL; NULL or "": "<folder>.consolidated" */
  int layout;                   /* sp_consolidate_layout; default SP_LAYOUT_TRAINER */
  int format;                   /* sp_consolidate_format; default SP_FORMAT_TORCH */
  uint64_t max_shard_bytes;     /* safetensors: files of at most this many bytes; 0 (default): one */
  uint64_t memory_budget_bytes; /* memory the copy may use; default 256 MiB */
  int verify_checksums;         /* verify the sidecar on every byte read; default 1 */
  int check_zip_crc;            /* zip CRC-32s where no sidecar covers, and meta.pt's; default 1 */
  int durable;                  /* fsync the output before publishing it; default 1 */
} sp_consolidate_options;
SP_EXPORT void sp_consolidate_options_init(sp_consolidate_options* options);

typedef struct sp_consolidate_result {
  size_t struct_size;
  char* output; /* the path written (malloc'd; sp_consolidate_result_free) */
  uint64_t tensors;
  uint64_t objects;
  uint64_t tensor_bytes;
  uint64_t bytes_read;
  uint64_t peak_rss_bytes;
  sp_zip_crc_counts zip_crc;
  double seconds;
} sp_consolidate_result;
SP_EXPORT void sp_consolidate_result_init(sp_consolidate_result* result);
/* Frees what the result holds and sets its pointers to NULL; the struct stays the caller's. */
SP_EXPORT void sp_consolidate_result_free(sp_consolidate_result* result);

/* Lightning's consolidate_checkpoint, streaming within options->memory_budget_bytes.
 * `options` may be NULL (defaults). Errors: SP_ERROR_PLAN for Lightning's validation (not a
 * folder, no .metadata / meta.pt), SP_ERROR_FORMAT / SP_ERROR_STORAGE for damaged input or
 * I/O, SP_ERROR_USAGE for options out of range. Blocks. */
SP_EXPORT sp_status sp_consolidate(const char* checkpoint_folder, const sp_consolidate_options* options,
                                   sp_consolidate_result* result, char** error);

typedef struct sp_reshard_options {
  size_t struct_size;
  int verify_checksums;         /* default 1 */
  int check_zip_crc;            /* default 1 */
  uint64_t memory_budget_bytes; /* tensor bytes held at once; default 256 MiB */
  int thread_count;             /* files per rank; default 1 (4 on object stores) */
  int durable;                  /* default 1 */
  int checksum;                 /* sp_checksum; default SP_CHECKSUM_CRC32C */
  int compression;              /* sp_compression; default SP_COMPRESSION_NONE */
  int compression_level;        /* zstd level 1..19; default 3 */
  int compression_threads;      /* zstd compression threads; 0: one per CPU (default) */
} sp_reshard_options;
SP_EXPORT void sp_reshard_options_init(sp_reshard_options* options);

typedef struct sp_reshard_result {
  size_t struct_size;
  int source_format; /* sp_checkpoint_format */
  uint64_t tensors;
  uint64_t objects;
  uint64_t payload_bytes;
  uint64_t bytes_written;
  sp_zip_crc_counts zip_crc;
  uint64_t meta_pt_bytes; /* Lightning's meta.pt carried over; 0: the source has none */
  double seconds;
} sp_reshard_result;
SP_EXPORT void sp_reshard_result_init(sp_reshard_result* result);

/* Rewrites any checkpoint (DCP or Hugging Face safetensors folder, or torch.save file) as a
 * DCP folder saved by `ranks` ranks, into the empty `destination`. `options` may be NULL.
 * Nothing is committed on failure. Blocks. */
SP_EXPORT sp_status sp_reshard(const char* source, const char* destination, int ranks,
                               const sp_reshard_options* options, sp_reshard_result* result, char** error);

typedef struct sp_verify_options {
  size_t struct_size;
  int quick; /* structure only: no tensor data read, no checksum checked; default 0 */
} sp_verify_options;
SP_EXPORT void sp_verify_options_init(sp_verify_options* options);

/* One problem: the file it is in and the item ("" when none), and the whole message. */
typedef struct sp_verify_problem {
  const char* file;
  const char* item;
  const char* message;
} sp_verify_problem;

/* Which checks covered the bytes of one checkpoint, or of its meta.pt. */
typedef struct sp_verify_coverage {
  const char* name;
  int format; /* sp_checkpoint_format */
  int quick;
  uint64_t structure_bytes;
  uint64_t zip_records;
  uint64_t zip_record_bytes;
  uint64_t zip_crc32_bytes;
  uint64_t no_checksum_bytes;
  int sidecar; /* sp_checksum of the sidecar; SP_CHECKSUM_NONE: none */
  uint64_t sidecar_bytes;
} sp_verify_coverage;

typedef struct sp_verify_result {
  size_t struct_size;
  void* owner; /* the library's; what the pointers below point into (sp_verify_result_free) */
  int ok;      /* no problems */
  uint64_t tensors;
  uint64_t objects;
  uint64_t bytes;          /* data read */
  uint64_t verified_bytes; /* of those, covered by a checksum that matched */
  size_t problem_count;
  const sp_verify_problem* problems; /* in the order found */
  size_t coverage_count;
  const sp_verify_coverage* coverage; /* the checkpoint, then its meta.pt when present */
} sp_verify_result;
SP_EXPORT void sp_verify_result_init(sp_verify_result* result);
/* Frees what the result holds (its owner) and sets its pointers to NULL. */
SP_EXPORT void sp_verify_result_free(sp_verify_result* result);

/* Checks a checkpoint (a DCP folder or URL, or a torch.save file): files present, chunks
 * tile each tensor, every blob parses, the sidecar's blocks and every zip record's CRC-32
 * match. A damaged checkpoint returns SP_OK with ok = 0 and the problems; errors are for
 * checkpoints that cannot be found or opened at all (SP_ERROR_NOT_FOUND, SP_ERROR_STORAGE).
 * `options` may be NULL. Blocks. */
SP_EXPORT sp_status sp_verify(const char* path_or_url, const sp_verify_options* options, sp_verify_result* result,
                              char** error);

/* No options yet: what `shardpoint inspect` asks beyond the structure (--hash, the zip
 * CRC-32 checks) reads tensor data and objects, which sp_inspect does not. The struct lets a
 * later version add options without a new function. */
typedef struct sp_inspect_options {
  size_t struct_size;
} sp_inspect_options;
SP_EXPORT void sp_inspect_options_init(sp_inspect_options* options);

/* One saved chunk of a tensor: the box [offsets, offsets + sizes) (the tensor's ndim each)
 * and its blob; storage.file is NULL where `.metadata` names no blob for the chunk. */
typedef struct sp_inspect_chunk {
  const int64_t* offsets;
  const int64_t* sizes;
  sp_storage_info storage;
} sp_inspect_chunk;

typedef struct sp_inspect_tensor {
  const char* fqn;
  const char* dtype; /* a PyTorch dtype name without "torch." */
  int ndim;
  const int64_t* shape;
  size_t chunk_count;
  const sp_inspect_chunk* chunks; /* in `.metadata`'s order */
} sp_inspect_tensor;

/* A bytes item (a pickled object); storage.file is NULL where `.metadata` names no blob. */
typedef struct sp_inspect_object {
  const char* fqn;
  sp_storage_info storage;
} sp_inspect_object;

typedef struct sp_inspect_result {
  size_t struct_size;
  void* owner; /* the library's; what the pointers below point into (sp_inspect_result_free) */
  int format;  /* sp_checkpoint_format: SP_CHECKPOINT_DCP or SP_CHECKPOINT_HF_SAFETENSORS */
  int sidecar; /* sp_checksum of the checksum sidecar; SP_CHECKSUM_NONE: none (PyTorch's saves) */
  size_t tensor_count;
  const sp_inspect_tensor* tensors; /* sorted by fqn */
  size_t object_count;
  const sp_inspect_object* objects; /* sorted by fqn */
  size_t file_count;
  const char* const* files; /* the data files the items name, sorted */
} sp_inspect_result;
SP_EXPORT void sp_inspect_result_init(sp_inspect_result* result);
/* Frees what the result holds (its owner) and sets its pointers to NULL. */
SP_EXPORT void sp_inspect_result_free(sp_inspect_result* result);

/* The structure of a checkpoint folder (DCP or Hugging Face safetensors) from its
 * `.metadata` (or safetensors headers) and checksum sidecar, without reading tensor data
 * or objects. `options` may be NULL. Errors: SP_ERROR_NOT_FOUND without a committed
 * checkpoint, SP_ERROR_FORMAT for a damaged `.metadata` or sidecar. Blocks. */
SP_EXPORT sp_status sp_inspect(const char* path_or_url, const sp_inspect_options* options, sp_inspect_result* result,
                               char** error);

/* ------------------------------------------------------------------------------------ */
/* Lightning's checkpoint folders: the engine's rules (engine/checkpoint_files.h), for   */
/* bindings that adapt them to a framework's interface                                    */

/* A list of strings the library returns; free with sp_string_list_free. */
typedef struct sp_string_list {
  size_t count;
  char** items;
} sp_string_list;
/* Frees the strings and the array and sets count = 0, items = NULL. */
SP_EXPORT void sp_string_list_free(sp_string_list* list);

/* *committed = 1 when `path_or_url` holds both commit markers, `.metadata` (the DCP data is
 * committed) and Lightning's `meta.pt` (written after it); 0 otherwise, nothing there
 * included. */
SP_EXPORT sp_status sp_checkpoint_committed(const char* path_or_url, int* committed, char** error);

/* The committed checkpoints directly in the local `folder`, oldest first (by the `step=N`
 * in their names, then meta.pt's modification time). A missing folder holds none.
 * Errors: SP_ERROR_USAGE for a URL. */
SP_EXPORT sp_status sp_list_committed_checkpoints(const char* folder, sp_string_list* paths, char** error);

/* Deletes a checkpoint folder (or URL prefix) uncommitting it first (meta.pt, .metadata,
 * then the rest), or a single checkpoint file. Nothing there is not an error. */
SP_EXPORT sp_status sp_remove_checkpoint(const char* path_or_url, char** error);

/* *path: the hidden folder beside the local `target` a save that replaces it writes first
 * (<parent>/.<name>.sp-replace-<tag>, tag cut to 16 characters; malloc'd). sp_replace_folder
 * swaps it in. Errors: SP_ERROR_USAGE for a URL. */
SP_EXPORT sp_status sp_staging_folder(const char* target, const char* tag, char** path, char** error);

/* Removes the staging folders failed saves into the local `target` left (none for a URL).
 * REQUIRES no save into `target` is in flight. *removed (may be NULL): how many went. */
SP_EXPORT sp_status sp_remove_stale_staging(const char* target, size_t* removed, char** error);

/* How one rank's items are split into data files (the rule sp_save applies), for a plan made
 * elsewhere (PyTorch DCP's, written with sp_write_items): files_per_rank(thread_count)
 * files where `single_file_per_rank` (sp_checkpoint_files_per_rank), else one per item.
 * kinds[i] (sp_item_kind) and nbytes[i] (a tensor chunk's bytes; ignored for bytes items)
 * describe item i. Out: file_of_item[i], the file (0 .. *file_count - 1, files with items
 * only) item i goes to; order[0..count): the items' positions file by file, each file in
 * the order its items are written. No I/O. */
SP_EXPORT sp_status sp_split_into_files(const sp_checkpoint* checkpoint, int thread_count, int single_file_per_rank,
                                        const int* kinds, const uint64_t* nbytes, size_t count, int* file_of_item,
                                        size_t* order, int* file_count, char** error);

/* Copies `count` byte ranges, sizes[i] bytes from srcs[i] to dsts[i] (REQUIRES: no two ranges
 * overlap), with stores that bypass the cache for large ranges: for copies whose destination
 * is not read again soon (an async save's host copy of the state, which the writer reads
 * later). Blocks until every byte is stored; thread-safe; never fails. */
SP_EXPORT void sp_copy_ranges(void* const* dsts, const void* const* srcs, const uint64_t* sizes, size_t count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDPOINT_C_API_H_ */
