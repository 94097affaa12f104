// Pickle writer: value tree -> bytes.
//
// Protocol 2 is what torch.save uses. With protocol 2 the writer emits only the opcodes
// CPython's protocol-2 pickler emits and, where the content allows it, only those that
// PyTorch's weights-only unpickler accepts (GLOBAL, BINPUT/BINGET, MARK, BINUNICODE,
// BININT/1/2, LONG1/LONG4, TUPLE/TUPLE1-3/EMPTY_TUPLE, NEWTRUE/NEWFALSE, BINPERSID, REDUCE,
// EMPTY_DICT, SETITEMS, EMPTY_LIST, APPENDS, BUILD, NONE, BINFLOAT, NEWOBJ, STOP).
// Protocol 4 adds FRAME, SHORT_BINUNICODE, STACK_GLOBAL, MEMOIZE, BINBYTES8 etc., as
// CPython's protocol 4 (what `.metadata` files use).
//
// A tree read by read_pickle() and written back rebuilds an equal object in Python:
// kObject nodes are re-emitted as their call (REDUCE / NEWOBJ / NEWOBJ_EX), followed by
// their appended items, set items and BUILD state. Shared nodes are written once and
// referenced through the memo; cycles through lists, dicts, sets and objects are written
// as Python does. A cycle that Python itself cannot pickle (through a tuple's own items)
// is a UsageError.
//
// Thread-safety: reentrant.
#pragma once

#include <string>

#include "core/byte_stream.h"
#include "pickle/value.h"

namespace shardpoint::pickle {

struct WriteOptions {
  // 2 (torch.save's data.pkl) or 4 (DCP .metadata as written by Python 3.8-3.13).
  int protocol = 2;
};

// Appends the pickle of root (ending with STOP) to out. Throws UsageError for a protocol
// other than 2 or 4 and for values that cannot be pickled.
void write_pickle(const Value& root, ByteSink& out, const WriteOptions& options = {});

// Convenience: the pickle as a string.
std::string pickle_to_string(const Value& root, const WriteOptions& options = {});

}  // namespace shardpoint::pickle
