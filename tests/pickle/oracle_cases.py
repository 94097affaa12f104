"""Oracle for the pickle layer: CPython writes reference pickles and judges rewritten ones.

Run from this directory with PYTHONPATH=. so that the classes below pickle as
`oracle_cases.<Name>` and load again under that name:

  python3 -c 'import oracle_cases; oracle_cases.main()' write DIR
      DIR/<case>.p<N>.pkl  pickle.dumps(value, N) for N in 0..5
      DIR/<case>.repr      repr(value) (UTF-8, surrogatepass) for cases whose repr shardpoint mirrors
      DIR/exact.txt        cases whose protocol 2 and 4 pickles shardpoint must reproduce byte for byte

  python3 -c 'import oracle_cases; oracle_cases.main()' check DIR
      loads every DIR/<case>.p<N>.w<P>.pkl (written by the C++ test), checks that it uses only
      protocol-P opcodes and equals a fresh value of <case>; prints "OK <file>" or
      "FAIL <file>: <why>", exits 1 on any failure.
"""

import argparse
import collections
import datetime
import enum
import math
import os
import pathlib
import pickle
import pickletools
import sys


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Slotted:
    """State pickled as a (None, slots dict) tuple."""
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __eq__(self, other):
        return type(other) is Slotted and (self.a, self.b) == (other.a, other.b)


class KwOnly:
    """Protocol 4 pickles it with NEWOBJ_EX."""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args = args
        obj.kwargs = kwargs
        return obj

    def __getnewargs_ex__(self):
        return self.args, self.kwargs

    def __eq__(self, other):
        return type(other) is KwOnly and (self.args, self.kwargs) == (other.args, other.kwargs)


def _shared():
    inner = [1, "x"]
    return [inner, inner, {"k": inner}]


def _cyclic_list():
    l = [1]
    l.append(l)
    return l


def _cyclic_dict():
    d = {"a": 1}
    d["self"] = d
    d["list"] = [d]
    return d


def _recursive_tuple():
    l = []
    t = (l, 2)
    l.append(t)
    return t


def _cyclic_object():
    p = Point(1, None)
    p.y = [p]
    return p


# name -> (factory, repr mirrored by shardpoint, pickles reproduced byte for byte)
CASES = {
    "none": (lambda: None, True, True),
    "bools": (lambda: [True, False], True, True),
    "ints": (lambda: [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**63, 2**64,
                      2**100, -2**70, 2**3000], True, True),
    "floats": (lambda: [0.0, -0.0, 1.5, 0.1, 1e-05, 1e16, 1e300, 5e-324, float("inf"), float("-inf"),
                        float("nan")], True, True),
    "unicode": (lambda: ["", "a", "caf\u00e9", "\U0001f600 emoji", "\x00\n\\'\"", "line\r\n\t", "\u20ac\u200b",
                         "\ud800"], True, True),
    "bytes": (lambda: [b"", b"abc", bytes(range(256)), b"'\""], True, True),
    "bytearray": (lambda: [bytearray(b""), bytearray(b"\x00\xff")], True, True),
    "tuples": (lambda: [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((),)], True, True),
    "dict": (lambda: {"a": 1, 2: "b", (1, 2): [3], None: True, 1.5: b"x"}, True, True),
    "sets": (lambda: [{1, "a", (1, 2)}, frozenset({1, 2}), set(), frozenset()], False, True),
    "ordered_dict": (lambda: collections.OrderedDict([("a", 1), ("b", [2])]), False, True),
    "nested": (lambda: {"l": [[[[1]]], {"d": {"e": ()}}], "t": ((("deep",),),)}, True, True),
    "shared": (_shared, True, True),
    "cyclic_list": (_cyclic_list, True, True),
    "cyclic_dict": (_cyclic_dict, True, True),
    "recursive_tuple": (_recursive_tuple, True, True),
    "cyclic_object": (_cyclic_object, False, True),
    "path": (lambda: pathlib.PosixPath("/a/b"), False, True),
    "namespace": (lambda: argparse.Namespace(lr=0.1, name="x"), False, True),
    "enum": (lambda: [Color.RED, Color.GREEN], False, True),
    "instance": (lambda: Point(1, [2.5, "z"]), False, True),
    "slotted": (lambda: Slotted(1, "b"), False, True),
    "newobj_ex": (lambda: KwOnly(1, b=2), False, False),  # CPython spells it with functools.partial
    "datetime": (lambda: [datetime.datetime(2020, 1, 2, 3, 4, 5, 6), datetime.date(1999, 12, 31),
                          datetime.timedelta(days=1, seconds=2)], False, True),
    "complex": (lambda: complex(1, -2), False, True),
    "long_list": (lambda: list(range(2500)), False, True),
    "long_dict": (lambda: {str(i): i for i in range(1001)}, False, True),
    "large_str": (lambda: "x" * 70000, False, False),  # the C pickler frames large payloads its own way
}


def write(directory):
    for name, (factory, mirrored_repr, exact) in CASES.items():
        for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
            try:
                data = pickle.dumps(factory(), protocol=protocol)
            except TypeError:  # e.g. __slots__ without __getstate__ below protocol 2
                continue
            with open(os.path.join(directory, f"{name}.p{protocol}.pkl"), "wb") as f:
                f.write(data)
        if mirrored_repr:
            with open(os.path.join(directory, f"{name}.repr"), "wb") as f:
                f.write(repr(factory()).encode("utf-8", "surrogatepass"))
    with open(os.path.join(directory, "exact.txt"), "w") as f:
        f.write("".join(name + "\n" for name, (_, _, exact) in CASES.items() if exact))


def same(a, b, assumed):
    """Structural equality that treats NaN as equal to NaN, keeps -0.0 apart from 0.0 and
    follows cycles (a pair met again is assumed equal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    key = (id(a), id(b))
    if key in assumed:
        return True
    assumed.add(key)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, assumed) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb, assumed) and same(va, vb, assumed)
                                        for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    if isinstance(a, Point):
        return same(a.x, b.x, assumed) and same(a.y, b.y, assumed)
    return a == b


def sharing_kept(name, value):
    if name == "shared":
        return value[0] is value[1] and value[0] is value[2]["k"]
    if name == "cyclic_list":
        return value[1] is value
    if name == "cyclic_dict":
        return value["self"] is value and value["list"][0] is value
    if name == "recursive_tuple":
        return value[0][0] is value
    if name == "cyclic_object":
        return value.y[0] is value
    return True


def highest_opcode_protocol(data):
    return max(opcode.proto for opcode, _, _ in pickletools.genops(data))


def check_file(directory, filename):
    name, source, written = filename[:-len(".pkl")].split(".")
    protocol = int(written[1:])
    with open(os.path.join(directory, filename), "rb") as f:
        data = f.read()
    used = highest_opcode_protocol(data)
    if used > protocol:
        return f"uses protocol {used} opcodes"
    value = pickle.loads(data)
    if not same(value, CASES[name][0](), set()):
        return f"loaded {value!r:.200}"
    if not sharing_kept(name, value):
        return "shared or cyclic references not kept"
    return None


def check(directory):
    failures = 0
    for filename in sorted(os.listdir(directory)):
        if filename.count(".") != 3 or not filename.endswith(".pkl"):
            continue
        try:
            problem = check_file(directory, filename)
        except Exception as e:  # any failure to load is a finding, not a crash of the oracle
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            print(f"OK {filename}")
        else:
            failures += 1
            print(f"FAIL {filename}: {problem}")
    return 1 if failures else 0


def main():
    command, directory = sys.argv[1], sys.argv[2]
    if command == "write":
        write(directory)
        return
    sys.exit(check(directory))
