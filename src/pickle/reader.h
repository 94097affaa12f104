// Pickle reader: bytes -> value tree, for protocols 0-5 and every opcode CPython emits.
//
// Nothing is executed: globals stay kGlobal, calls stay kObject, persistent ids stay
// kPersistentId (see value.h). Memo sharing is kept as shared nodes; cycles are allowed
// (see value.h for the ownership of cyclic graphs).
//
// Hostile input: any malformed, truncated or lying input throws FormatError naming
// `source_name`, the byte offset of the opcode and what was expected, e.g.
//   "data.pkl: BINUNICODE at offset 2: expected 5 bytes of UTF-8 text, 2 left".
// Never a crash, hang or unbounded allocation: every length is checked against the bytes
// that remain before anything is allocated, the memo grows only with its entries (a
// LONG_BINPUT index of 2^32-1 costs one map entry), text ints are limited to CPython's 4300 digits, and nesting
// deeper than ReadOptions::max_depth is refused. Parsing does not recurse.
//
// Semantics are CPython's pickle._Unpickler with nothing called:
//   - GLOBAL / STACK_GLOBAL -> kGlobal; INST, OBJ, REDUCE, NEWOBJ, NEWOBJ_EX -> kObject
//     (INST / OBJ without arguments -> kNewObj, as CPython then calls cls.__new__(cls));
//     REDUCE and NEWOBJ need an argument tuple, NEWOBJ_EX a keyword dict.
//   - BUILD sets the state of a kObject; BUILD on anything else, or a second BUILD on the
//     same object, is a FormatError. APPEND(S) go to a list or an object's items(),
//     SETITEM(S) to a dict or an object's entries(), ADDITEMS to a set only.
//   - Spellings that only exist because old protocols lack an opcode are read as what they
//     mean, so a tree does not depend on the protocol it came from (the writer spells them
//     again for protocol 2): REDUCE(_codecs.encode, (text, 'latin1')) and
//     REDUCE(builtins.bytes, ()) -> kBytes; REDUCE(builtins.bytearray, () | (bytes,) |
//     (text, 'latin-1')) -> kByteArray; REDUCE(builtins.set | frozenset, () | (list,))
//     -> kSet / kFrozenSet; REDUCE(copyreg.__newobj_ex__, (cls, args, kwargs)) -> NEWOBJ_EX.
//   - Below protocol 3, Python 2 names are mapped as Python 3's fix_imports does, for the
//     names data pickles use: modules __builtin__ -> builtins, copy_reg -> copyreg,
//     exceptions -> builtins; __builtin__.{xrange, unicode, basestring, long, unichr} ->
//     builtins.{range, str, str, int, chr}, __builtin__.reduce -> functools.reduce,
//     __builtin__.intern -> sys.intern.
//   - Python 2 str (STRING, BINSTRING, SHORT_BINSTRING) becomes kStr when it is ASCII and
//     kBytes otherwise (Python 3 would fail to decode it as ASCII). Text is UTF-8; lone
//     surrogates are kept in the "surrogatepass" form BINUNICODE uses.
//   - Not supported (FormatError): out-of-band buffers (NEXT_BUFFER, READONLY_BUFFER) and
//     extension registry codes (EXT1/2/4).
//   - Known difference: a dict or set keeps duplicate keys in order (Python keeps the last
//     value in the first position); CPython never writes duplicates.
//
// Thread-safety: read_pickle is reentrant.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/byte_io.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle {

struct ReadOptions {
  // Deepest nesting accepted: the longest chain of nodes from the root, counting a node on
  // a cycle as its whole cycle, so any walker that recurses (writer, repr, deep_equal)
  // stays within this many levels. Costs one pass over the graph after parsing (a cheap
  // walk when the pickle cannot hold a cycle, the strongly-connected-components pass when it
  // mutated a node it had handed out twice). Raise it
  // only for trusted input; the writer accepts up to 6000 levels.
  std::size_t max_depth = 2000;
  // Stop after the first STOP opcode; bytes after it are ignored (Python's pickle.loads
  // ignores them too). When false, trailing bytes are a FormatError.
  bool allow_trailing_bytes = true;
};

// Parses one pickle from data. `source_name` is used in error messages (a file name,
// "archive/data.pkl in model.pt", ...). The tree owns its own copies of the bytes; data
// may be freed afterwards. If the graph has a cycle, the returned pointer owns the whole
// graph (see value.h). Throws FormatError; nothing leaks when it does.
ValuePtr read_pickle(ByteSpan data, std::string_view source_name, const ReadOptions& options = {});

}  // namespace shardpoint::pickle
