// The storages an object tree of a torch.save archive references, for writing that object
// into another archive as torch.save writes it. A DCP bytes item is a whole torch.save
// archive of one object (docs/dcp-format.md §2.5); when the object holds tensors (a tuple
// `(tensor, 'l2')`, a namespace holding a dict of tensors), its tree refers to storages by
// persistent id, ('storage', torch.<Type>Storage, key, location, numel), and the bytes are
// the archive's data/<key> records. Writing the object elsewhere (a resharded item, the
// consolidated file) keeps the tree as it is, gives the storages the keys torch.save would
// give them there, and copies each record's bytes.
//
// torch.save numbers storages "0", "1", ... in the order its pickler first meets them, and
// every reference to one storage gets the same key; renumber_storages() does the same, in
// the pickle writer's order (pickle/tree_edit.h).
//
// Thread-safety: the functions are reentrant; renumber_storages() edits its tree, which no
// other thread may use meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::torchfile {

// One storage persistent id.
struct StorageRef {
  std::string key;           // as the tree names it (an int key of old files as its digits)
  std::string type_name;     // "FloatStorage", ..., "UntypedStorage"
  std::uint64_t nbytes = 0;  // numel x the type's element size (UntypedStorage: numel bytes)
  // Bytes per element that a big-endian archive stores reversed (complex: per half); 1 for
  // UntypedStorage and one-byte types, which torch.load does not swap either.
  std::size_t swap_width = 1;
};

// Parses the persistent id node `node` (kPersistentId). Throws FormatError starting with
// `where` unless it is ('storage', <storage type global>, key str|int, location str,
// numel int >= 0) with a storage type PyTorch 2.x saves.
StorageRef parse_storage_pid(const pickle::Value& node, const std::string& where);

// A new persistent id node like `node` (REQUIRES parse_storage_pid accepts it) that names
// the storage whose key is the str node `key` (share one node among the references to a
// storage, as torch.save's memo does); the type, location and numel nodes are shared with
// `node`.
pickle::ValuePtr rename_storage_pid(const pickle::Value& node, const pickle::ValuePtr& key);

struct RenamedStorage {
  StorageRef source;  // as the archive the tree came from names it
  std::string key;    // as the tree names it now
};

// Gives the storages `root` references the keys first_key, first_key + 1, ... (decimal) in
// the order the pickle writer meets their persistent ids, one key per source key, and
// replaces in place every persistent id node whose key changes (the others are kept).
// Returns the storages in new-key order.
// Throws FormatError (`where`) for a persistent id parse_storage_pid refuses.
std::vector<RenamedStorage> renumber_storages(pickle::ValuePtr& root, const std::string& where,
                                              std::size_t first_key = 0);

// Copies bytes [at, at + dest.size()) of storage `ref` from its record data/<key> in `file`,
// in little-endian element order (a big-endian archive's elements reversed, as torch.load
// does). REQUIRES at and dest.size() multiples of ref.swap_width, at + dest.size() <=
// ref.nbytes. Throws FormatError when the record is missing or shorter than ref.nbytes,
// and what the source's read throws.
void read_storage_bytes(const TorchFile& file, const StorageRef& ref, std::uint64_t at, std::span<std::byte> dest);

// Writes `object` (the root or any node of file's tree) to `writer` as torch.save writes
// that object alone: its pickle with renumbered storages, then each storage's bytes copied
// from `file`. `object` is not modified (a copy is renumbered). REQUIRES nothing written to
// `writer` yet; the caller calls finish(). Throws FormatError (bad persistent ids or
// records; the message starts with file's source name), what the writer throws.
void write_object_with_storages(TorchSaveWriter& writer, const pickle::Value& object, const TorchFile& file);

}  // namespace shardpoint::torchfile
