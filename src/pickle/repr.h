// Python-like text of a value tree, for `shardpoint inspect`.
//
// Follows Python's repr() where Python has one: None, True, 3, 1.5, inf, nan, 'text'
// (Python's quoting and escapes), b'\x00', bytearray(b''), (1,), [1, 2], {'a': 1},
// {1, 2}, frozenset({1}). Objects shardpoint does not interpret are shown as the call that
// builds them, e.g. pathlib.PosixPath('/a/b'), collections.OrderedDict([('a', 1)]),
// argparse.Namespace(lr=0.1) when the state is a dict of str keys, enum calls as
// mymod.Color(1); a global is module.name. Cycles print as [...] / {...} like Python.
// Output longer than max_chars is cut with "...".
#pragma once

#include <cstddef>
#include <string>

#include "pickle/value.h"

namespace shardpoint::pickle {

struct ReprOptions {
  std::size_t max_chars = 1000;
};

std::string repr(const Value& value, const ReprOptions& options = {});

}  // namespace shardpoint::pickle
