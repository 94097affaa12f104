// The pickle value tree: what a pickle holds, as data, with nothing executed.
//
// A Value is one node: None, bool, int (any size), float, str, bytes, bytearray, tuple,
// list, dict (insertion order kept), set, frozenset, or one of three kinds for what
// shardpoint does not interpret:
//   kGlobal       - a reference to module.name (GLOBAL / STACK_GLOBAL);
//   kObject       - the result of calling something: REDUCE(callable, args),
//                   NEWOBJ(cls, args) or NEWOBJ_EX(cls, args, kwargs), plus what was done
//                   to it afterwards: BUILD state, and items added by APPEND(S)/SETITEM(S)
//                   (e.g. an OrderedDict is REDUCE(collections.OrderedDict, ()) + SETITEMS);
//   kPersistentId - BINPERSID/PERSID: a reference resolved by the container (torch.save
//                   storages).
// Nodes are shared through ValuePtr (std::shared_ptr), so memo sharing in a pickle stays
// sharing in the tree, and the writer reproduces it. Destroying a deep tree does not
// recurse (no stack overflow on hostile nesting).
//
// Cycles: a pickle may hold a container that contains itself. read_pickle() returns a
// root that owns such a graph; when the last reference to that root goes away, every node
// of the graph is emptied (children released) so nothing leaks. Keep the root alive while
// using nodes of a cyclic graph.
//
// Thread-safety: a tree may be read from many threads; mutation needs external locking.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardpoint::pickle {

class Value;
using ValuePtr = std::shared_ptr<Value>;
using DictEntries = std::vector<std::pair<ValuePtr, ValuePtr>>;

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kByteArray,
  kTuple,
  kList,
  kDict,
  kSet,
  kFrozenSet,
  kGlobal,
  kObject,
  kPersistentId,
};

// How a kObject was made.
enum class CallKind {
  kReduce,    // callable(*args)
  kNewObj,    // cls.__new__(cls, *args)
  kNewObjEx,  // cls.__new__(cls, *args, **kwargs)
};

std::string_view kind_name(Kind kind);

class Value {
 public:
  // --- construction -------------------------------------------------------------------
  static ValuePtr none();
  static ValuePtr boolean(bool v);
  static ValuePtr integer(std::int64_t v);
  // An int from little-endian two's-complement bytes (the LONG1/LONG4 payload). Stored as
  // int64 when it fits; otherwise kept as bytes.
  static ValuePtr big_integer(std::string le_twos_complement);
  static ValuePtr floating(double v);
  static ValuePtr str(std::string utf8);
  static ValuePtr bytes(std::string data);
  static ValuePtr bytearray(std::string data);
  static ValuePtr tuple(std::vector<ValuePtr> items = {});
  static ValuePtr list(std::vector<ValuePtr> items = {});
  static ValuePtr dict(DictEntries entries = {});
  static ValuePtr set(std::vector<ValuePtr> items = {});
  static ValuePtr frozenset(std::vector<ValuePtr> items = {});
  static ValuePtr global(std::string module, std::string name);
  // kwargs may be null (only NEWOBJ_EX has them).
  static ValuePtr object(CallKind call, ValuePtr callable, ValuePtr args, ValuePtr kwargs = nullptr);
  // Shorthand for REDUCE(global(module, name), tuple(args)).
  static ValuePtr call(std::string module, std::string name, std::vector<ValuePtr> args);
  static ValuePtr persistent_id(ValuePtr pid);

  explicit Value(Kind kind) : kind_(kind) {}
  ~Value();
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;

  // --- inspection ---------------------------------------------------------------------
  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_none() const { return kind_ == Kind::kNone; }
  // True for a kGlobal with this module and name.
  bool is_global(std::string_view module, std::string_view name) const;

  // Accessors throw FormatError naming the expected and actual kind when the kind is wrong.
  bool as_bool() const;
  // REQUIRES kInt; throws FormatError if the value does not fit in int64.
  std::int64_t as_int() const;
  bool int_fits_int64() const { return kind_ == Kind::kInt && !big_; }
  // Little-endian two's complement bytes of a kInt (minimal length; "" for zero).
  std::string int_le_bytes() const;
  double as_float() const;
  // kStr, kBytes, kByteArray: the payload.
  const std::string& as_string() const;

  // kTuple, kList, kSet, kFrozenSet: the elements. kObject: items added by APPEND(S).
  const std::vector<ValuePtr>& items() const;
  std::vector<ValuePtr>& mutable_items();
  // kDict: the entries in insertion order. kObject: entries added by SETITEM(S).
  const DictEntries& entries() const;
  DictEntries& mutable_entries();
  // kDict: the value under the str key `key`, or nullptr.
  ValuePtr get(std::string_view key) const;

  // kGlobal
  const std::string& module() const;
  const std::string& name() const;

  // kObject
  CallKind call_kind() const;
  const ValuePtr& callable() const;
  const ValuePtr& args() const;
  const ValuePtr& kwargs() const;  // null unless NEWOBJ_EX
  const ValuePtr& state() const;   // null when no BUILD
  void set_state(ValuePtr state);

  // kPersistentId
  const ValuePtr& pid() const;

 private:
  void expect(Kind k, const char* accessor) const;
  friend void release_children(Value& v, std::vector<ValuePtr>& out);

  Kind kind_;
  bool big_ = false;  // kInt stored in text_ as LE bytes
  CallKind call_ = CallKind::kReduce;
  std::int64_t int_ = 0;  // kBool (0/1), kInt
  double float_ = 0;
  std::string text_;  // str/bytes payload, big int bytes, global module
  std::string name_;  // global name
  std::vector<ValuePtr> items_;
  DictEntries entries_;
  ValuePtr callable_, args_, kwargs_, state_;  // object; pid in callable_
};

// Deep structural equality (values, not identity). Dicts compare in order; sets compare
// as multisets are not needed here, so they compare in order too. Globals compare module
// and name. Cycles: compared up to a depth limit; a graph is equal to an isomorphic one.
bool deep_equal(const Value& a, const Value& b);

}  // namespace shardpoint::pickle
