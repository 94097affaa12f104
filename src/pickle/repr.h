// Python-like text of a value tree, for `shardpoint inspect`.
//
// Follows Python's repr() where Python has one: None, True, 3, 1.5, inf, nan, 'text'
// (Python's quoting and escapes), b'\x00', bytearray(b''), (1,), [1, 2], {'a': 1},
// {1, 2}, frozenset({1}). Objects shardpoint does not interpret are shown as the call that
// builds them, e.g. pathlib.PosixPath('/a/b'), collections.OrderedDict([('a', 1)]),
// argparse.Namespace(lr=0.1) when the state is a dict of str keys, enum calls as
// mymod.Color(1); a global is module.name. Also: getattr(mymod.Color, 'RED') prints as
// mymod.Color.RED, a dict state that is not keyword-like as state=<repr>, items and
// entries added to an object as a list argument ([1, 2] / [('k', v)]), a persistent id as
// persistent_id(<repr of the id>). Cycles print as [...] / {...} / (...) like Python.
// Differences from Python: non-ASCII code points Python's str.isprintable() rejects are
// escaped for controls, separators, format characters, surrogates, private use and
// noncharacters, but unassigned code points print as themselves; ints beyond CPython's
// 4300-digit limit print in hex (0x...); nesting deeper than 2500 prints as "...".
// Output longer than max_chars is cut (on a UTF-8 character boundary) and ends with
// "..."; printing stops there, so shared subtrees cannot make it slow.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle {

struct ReprOptions {
  std::size_t max_chars = 1000;
  // When set, called for each node before it is printed: a result is printed instead of
  // the node (and its children). `inspect` shows the tensors inside an object this way
  // rather than as their rebuild calls. Empty: every node prints as above.
  std::function<std::optional<std::string>(const Value&)> node_text;
};

std::string repr(const Value& value, const ReprOptions& options = {});

}  // namespace shardpoint::pickle
