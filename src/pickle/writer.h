// Pickle writer: value tree -> bytes.
//
// Protocol 2 is what torch.save uses. With protocol 2 the writer emits only the opcodes
// CPython's protocol-2 pickler emits and, where the content allows it, only those that
// PyTorch 1.13's weights-only unpickler (torch/_weights_only_unpickler.py) accepts:
// PROTO, GLOBAL, BINPUT/LONG_BINPUT, BINGET/LONG_BINGET, MARK, BINUNICODE, BININT/1/2,
// LONG1, TUPLE/TUPLE1-3/EMPTY_TUPLE, NEWTRUE/NEWFALSE, NONE, BINPERSID, REDUCE, NEWOBJ,
// EMPTY_DICT, SETITEM(S), EMPTY_LIST, APPEND(S), BUILD, STOP. Outside that list, and only
// when the content needs them: BINFLOAT for floats (1.13's list has no float opcode at
// all, so a pickle holding a float cannot be loaded weights_only on 1.13, exactly as
// torch.save's own output; 2.x accepts BINFLOAT), LONG4 for ints of 256+ bytes, POP /
// POP_MARK for a tuple that contains itself through a list (as CPython writes it).
// Protocol 2 has no bytes, set or keyword-argument opcodes, so, like CPython, it writes
// bytes as _codecs.encode('<latin-1 text>', 'latin1') (bytes() when empty), bytearray as
// bytearray(<bytes>), set / frozenset as builtins.set([...]), a nested global name a.B.c as
// getattr(a.B, 'c'), and NEWOBJ_EX as copyreg.__newobj_ex__(cls, args, kwargs) (CPython
// uses functools.partial; both load the same); read_pickle() reads all of these back as
// the original tree. Globals get Python 2 names as CPython's fix_imports does (builtins ->
// __builtin__, copyreg -> copy_reg, builtins.int -> __builtin__.long, ...).
// Protocol 4 is laid out as CPython 3.8+ writes it (what `.metadata` files use): FRAME
// (a new frame after 64 KiB; payloads of 64 KiB or more outside frames), SHORT_BINUNICODE,
// SHORT_BINBYTES / BINBYTES / BINBYTES8, STACK_GLOBAL, MEMOIZE, EMPTY_SET / ADDITEMS,
// FROZENSET, NEWOBJ_EX.
// Memo and batching copy CPython's C pickler, so a pickle CPython wrote comes back byte for
// byte after read + write in most cases (tests/pickle/oracle_test.cc checks which): every
// str, bytes, non-empty tuple, list, dict, set and object is memoized; a global is written
// once per module.name and then fetched; APPENDS / SETITEMS / ADDITEMS hold 1000 items.
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
#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle {

struct WriteOptions {
  // 2 (torch.save's data.pkl) or 4 (DCP .metadata as written by Python 3.8-3.13).
  int protocol = 2;
};

// Appends the pickle of root (ending with STOP) to out; on error, what was already
// appended to out is incomplete. Throws UsageError for a protocol other than 2 or 4 and
// for values that cannot be pickled: a cycle only through tuples, call arguments or
// persistent ids; a str that is not UTF-8 (lone surrogates allowed); object arguments that
// are not a tuple (or kwargs that are not a dict); a null child; a global name with a
// newline or in a Python 2 module (__builtin__, copy_reg, exceptions: a protocol-2 reader
// takes them for Python 3's; only a pickle that switched to protocol 3 mid-stream gives
// them) at protocol 2; nesting deeper than 6000 levels (the writer recurses; anything
// read_pickle accepts with the default max_depth fits).
void write_pickle(const Value& root, ByteSink& out, const WriteOptions& options = {});

// Convenience: the pickle as a string.
std::string pickle_to_string(const Value& root, const WriteOptions& options = {});

}  // namespace shardpoint::pickle
