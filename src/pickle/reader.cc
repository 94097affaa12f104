#include "pickle/reader.h"

#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pickle/number_text.h"
#include "pickle/opcodes.h"
#include "pickle/text_codec.h"
#include "pickle/value_graph.h"
#include "shardpoint/error.h"

namespace shardpoint::pickle {

namespace {

// Python 3's fix_imports for protocol 0-2 pickles (CPython's _compat_pickle), the part
// that can appear in data pickles; the writer applies the reverse for protocol 2.
struct GlobalRename {
  std::string_view py2_module, py2_name, py3_module, py3_name;
};
constexpr GlobalRename kNameRenames[] = {
    {"__builtin__", "xrange", "builtins", "range"},   {"__builtin__", "unicode", "builtins", "str"},
    {"__builtin__", "long", "builtins", "int"},       {"__builtin__", "unichr", "builtins", "chr"},
    {"__builtin__", "reduce", "functools", "reduce"}, {"__builtin__", "intern", "sys", "intern"},
    {"__builtin__", "basestring", "builtins", "str"},
};
constexpr std::pair<std::string_view, std::string_view> kModuleRenames[] = {
    {"__builtin__", "builtins"}, {"copy_reg", "copyreg"}, {"exceptions", "builtins"}};

void fix_py2_global(std::string& module, std::string& name) {
  for (const auto& r : kNameRenames) {
    if (module == r.py2_module && name == r.py2_name) {
      module = r.py3_module;
      name = r.py3_name;
      return;
    }
  }
  for (const auto& [py2, py3] : kModuleRenames) {
    if (module == py2) {
      module = py3;
      return;
    }
  }
}

// Owns a cyclic graph: when the last reference to the root goes, every node on a cycle is
// emptied, which frees the rest through ordinary reference counting.
struct CycleOwner {
  ValuePtr root;
  std::vector<ValuePtr> cyclic_nodes;
  ~CycleOwner() {
    std::vector<ValuePtr> released;
    for (auto& node : cyclic_nodes) release_children(*node, released);
  }
};

bool has_children(Kind kind) {
  switch (kind) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kObject:
    case Kind::kPersistentId: return true;
    default: return false;
  }
}

// The memo. Indices are dense from 0 in everything CPython writes, so a vector serves
// them; an index far beyond the entries so far (a lying LONG_BINPUT of 2^32-1) goes to a
// map and costs one entry, never gigabytes.
class Memo {
 public:
  // An index put in the map stays there even when the vector later grows past it.
  const ValuePtr* find(std::uint64_t index) const {
    if (index < dense_.size() && dense_[index]) return &dense_[index];
    auto it = sparse_.find(index);
    return it == sparse_.end() ? nullptr : &it->second;
  }

  void put(std::uint64_t index, const ValuePtr& value) {
    if (auto it = sparse_.find(index); it != sparse_.end()) {
      it->second = value;
      return;
    }
    if (index < dense_.size() || index < 2 * count_ + 64) {
      if (index >= dense_.size()) dense_.resize(index + 1);
      if (!dense_[index]) ++count_;
      dense_[index] = value;
      return;
    }
    sparse_.emplace(index, value);
    ++count_;
  }

  // Distinct indices set (what MEMOIZE uses as the next index, like CPython's len(memo)).
  std::size_t size() const { return count_; }

 private:
  std::vector<ValuePtr> dense_;
  std::unordered_map<std::uint64_t, ValuePtr> sparse_;
  std::size_t count_ = 0;
};

bool is_str(const ValuePtr& v, std::string_view text) { return v && v->is(Kind::kStr) && v->as_string() == text; }

class Unpickler {
 public:
  Unpickler(ByteSpan data, std::string_view source_name, const ReadOptions& options)
      : data_(data), source_(source_name), options_(options) {}

  // A failed read may leave cycles among the nodes made so far; empty them all.
  ~Unpickler() {
    if (succeeded_ || !maybe_cyclic_) return;
    std::vector<ValuePtr> released;
    for (auto& node : created_) release_children(*node, released);
  }

  ValuePtr run() {
    ValuePtr root = execute();
    if (!options_.allow_trailing_bytes && pos_ != data_.size()) {
      throw FormatError(std::string(source_) + ": " + std::to_string(data_.size() - pos_) +
                        " bytes after STOP at offset " + std::to_string(pos_ - 1));
    }
    ValuePtr owned = take_ownership(root);
    succeeded_ = true;
    return owned;
  }

 private:
  // --- the machine ------------------------------------------------------------------
  ValuePtr execute() {
    for (;;) {
      op_offset_ = pos_;
      if (pos_ >= data_.size()) {
        throw FormatError(std::string(source_) + ": pickle ended at offset " + std::to_string(pos_) +
                          " without a STOP opcode");
      }
      code_ = std::to_integer<std::uint8_t>(data_[pos_++]);
      if (code_ == op::kStop) return pop();
      dispatch();
    }
  }

  void dispatch() {
    if (dispatch_scalar() || dispatch_text() || dispatch_container() || dispatch_call() || dispatch_memo()) {
      return;
    }
    fail("unknown opcode");
  }

  bool dispatch_scalar() {
    switch (code_) {
      case op::kNone: push(Value::none()); return true;
      case op::kNewTrue: push(Value::boolean(true)); return true;
      case op::kNewFalse: push(Value::boolean(false)); return true;
      case op::kBinInt: push(Value::integer(static_cast<std::int32_t>(read_le<std::uint32_t>("int")))); return true;
      case op::kBinInt1: push(Value::integer(read_le<std::uint8_t>("int"))); return true;
      case op::kBinInt2: push(Value::integer(read_le<std::uint16_t>("int"))); return true;
      case op::kLong1: push_long(read_length<std::uint8_t>()); return true;
      case op::kLong4: push_long(read_signed_length()); return true;
      case op::kBinFloat: push(Value::floating(read_binfloat())); return true;
      case op::kShortBinUnicode: push_utf8(read_length<std::uint8_t>()); return true;
      case op::kBinUnicode: push_utf8(read_length<std::uint32_t>()); return true;
      case op::kBinUnicode8: push_utf8(read_length<std::uint64_t>()); return true;
      case op::kShortBinBytes: push(Value::bytes(read_bytes(read_length<std::uint8_t>()))); return true;
      case op::kBinBytes: push(Value::bytes(read_bytes(read_length<std::uint32_t>()))); return true;
      case op::kBinBytes8: push(Value::bytes(read_bytes(read_length<std::uint64_t>()))); return true;
      case op::kByteArray8: push(Value::bytearray(read_bytes(read_length<std::uint64_t>()))); return true;
      case op::kShortBinString: push_py2_str(read_chars(read_length<std::uint8_t>(), "string")); return true;
      case op::kBinString: push_py2_str(read_chars(read_signed_length(), "string")); return true;
      case op::kNextBuffer:
      case op::kReadonlyBuffer: fail("out-of-band buffers not supported");
      default: return false;
    }
  }

  // Protocol 0 opcodes whose argument is a line of text.
  bool dispatch_text() {
    switch (code_) {
      case op::kInt: load_text_int(); return true;
      case op::kLong: load_text_long(); return true;
      case op::kFloat: load_text_float(); return true;
      case op::kString: load_text_string(); return true;
      case op::kUnicode: {
        auto text = decode_raw_unicode_escape(read_line());
        if (!text) fail("malformed raw-unicode-escape text");
        push(Value::str(std::move(*text)));
        return true;
      }
      case op::kPersId: {
        std::string_view pid = read_line();
        for (char c : pid) {
          if (static_cast<unsigned char>(c) >= 0x80) fail("persistent id is not ASCII");
        }
        push(track(Value::persistent_id(Value::str(std::string(pid)))));
        return true;
      }
      default: return false;
    }
  }

  bool dispatch_container() {
    switch (code_) {
      case op::kMark: marks_.push_back(stack_.size()); return true;
      case op::kPop:
        // CPython: an empty stack since the last MARK pops the MARK itself.
        if (stack_.size() > frame_base()) stack_.pop_back();
        else pop_mark();
        return true;
      case op::kPopMark: pop_mark(); return true;
      case op::kDup: {
        ValuePtr copy = top();
        note_alias(copy);
        push(std::move(copy));
        return true;
      }
      case op::kEmptyTuple: push(track(Value::tuple())); return true;
      case op::kTuple1: push_tuple(1); return true;
      case op::kTuple2: push_tuple(2); return true;
      case op::kTuple3: push_tuple(3); return true;
      case op::kTuple: push(track(Value::tuple(pop_mark()))); return true;
      case op::kEmptyList: push(track(Value::list())); return true;
      case op::kList: push(track(Value::list(pop_mark()))); return true;
      case op::kEmptyDict: push(track(Value::dict())); return true;
      case op::kDict: {
        auto dict = track(Value::dict());
        add_entries(*dict, pop_mark());
        push(dict);
        return true;
      }
      case op::kEmptySet: push(track(Value::set())); return true;
      case op::kFrozenSet: push(track(Value::frozenset(pop_mark()))); return true;
      case op::kAppend: {
        ValuePtr item = pop();
        append_items(top(), {std::move(item)});
        return true;
      }
      case op::kAppends: {
        auto items = pop_mark();
        append_items(top(), std::move(items));
        return true;
      }
      case op::kSetItem: {
        ValuePtr value = pop();
        ValuePtr key = pop();
        set_items(top(), {std::move(key), std::move(value)});
        return true;
      }
      case op::kSetItems: {
        auto items = pop_mark();
        set_items(top(), std::move(items));
        return true;
      }
      case op::kAddItems: {
        auto items = pop_mark();
        const ValuePtr& target = top();
        if (!target->is(Kind::kSet)) fail("expected a set to add items to, found " + kind_of(target));
        note_mutation(target);
        for (auto& item : items) target->mutable_items().push_back(std::move(item));
        return true;
      }
      default: return false;
    }
  }

  bool dispatch_call() {
    switch (code_) {
      case op::kGlobal: {
        std::string module = read_utf8_line("module name");
        std::string name = read_utf8_line("global name");
        push(make_global(std::move(module), std::move(name)));
        return true;
      }
      case op::kStackGlobal: {
        ValuePtr name = pop();
        ValuePtr module = pop();
        if (!module->is(Kind::kStr) || !name->is(Kind::kStr)) fail("expected str module and name on the stack");
        push(make_global(module->as_string(), name->as_string()));
        return true;
      }
      case op::kReduce: {
        ValuePtr args = pop();
        ValuePtr callable = pop();
        expect_kind(args, Kind::kTuple, "argument tuple");
        push(track(reduce(std::move(callable), std::move(args))));
        return true;
      }
      case op::kNewObj: {
        ValuePtr args = pop();
        ValuePtr cls = pop();
        expect_kind(args, Kind::kTuple, "argument tuple");
        push(track(Value::object(CallKind::kNewObj, std::move(cls), std::move(args))));
        return true;
      }
      case op::kNewObjEx: {
        ValuePtr kwargs = pop();
        ValuePtr args = pop();
        ValuePtr cls = pop();
        expect_kind(args, Kind::kTuple, "argument tuple");
        expect_kind(kwargs, Kind::kDict, "keyword argument dict");
        push(track(Value::object(CallKind::kNewObjEx, std::move(cls), std::move(args), std::move(kwargs))));
        return true;
      }
      case op::kBuild: {
        ValuePtr state = pop();
        const ValuePtr& target = top();
        if (!target->is(Kind::kObject)) fail("expected an object to BUILD, found " + kind_of(target));
        if (target->state()) fail("object already has BUILD state (a second BUILD is not supported)");
        note_mutation(target);
        target->set_state(std::move(state));
        return true;
      }
      case op::kInst: load_inst(); return true;
      case op::kObj: load_obj(); return true;
      case op::kBinPersId: push(track(Value::persistent_id(pop()))); return true;
      case op::kExt1:
      case op::kExt2:
      case op::kExt4: fail("extension registry codes (copyreg.add_extension) are not supported");
      default: return false;
    }
  }

  bool dispatch_memo() {
    switch (code_) {
      case op::kBinGet: memo_get(read_le<std::uint8_t>("memo index")); return true;
      case op::kLongBinGet: memo_get(read_le<std::uint32_t>("memo index")); return true;
      case op::kGet: memo_get(read_text_index()); return true;
      case op::kBinPut: memo_put(read_le<std::uint8_t>("memo index")); return true;
      case op::kLongBinPut: memo_put(read_le<std::uint32_t>("memo index")); return true;
      case op::kPut: memo_put(read_text_index()); return true;
      case op::kMemoize: memo_put(memo_.size()); return true;
      case op::kFrame: {
        // Frames only batch reads for streams; the bytes are all here already.
        std::uint64_t length = read_le<std::uint64_t>("frame length");
        if (length > remaining()) {
          fail("frame of " + std::to_string(length) + " bytes, " + std::to_string(remaining()) + " left");
        }
        return true;
      }
      case op::kProto: {
        int proto = read_le<std::uint8_t>("protocol");
        if (proto > op::kHighestProtocol) fail("unsupported protocol " + std::to_string(proto));
        proto_ = proto;
        return true;
      }
      default: return false;
    }
  }

  // --- opcode helpers ------------------------------------------------------------------
  void load_text_int() {
    std::string_view line = read_line();
    if (line == "00" || line == "01") {
      push(Value::boolean(line == "01"));  // protocol 0 bools
      return;
    }
    push_decimal_int(line);
  }

  void load_text_long() {
    std::string_view line = read_line();
    if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
    push_decimal_int(line);
  }

  void push_decimal_int(std::string_view text) {
    auto le = parse_decimal_int(text);
    if (!le) fail("expected a decimal integer of at most " + std::to_string(kMaxIntDigits) + " digits");
    push(Value::big_integer(std::move(*le)));
  }

  void load_text_float() {
    auto value = parse_python_float(read_line());
    if (!value) fail("expected a decimal float");
    push(Value::floating(*value));
  }

  void load_text_string() {
    std::string_view line = read_line();
    if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"')) {
      fail("the STRING argument must be quoted");
    }
    auto data = decode_string_escape(line.substr(1, line.size() - 2));
    if (!data) fail("malformed string escape");
    push_py2_str(*data);
  }

  // Python 2 str: Python 3 decodes it as ASCII by default. ASCII payloads become str;
  // anything else stays bytes (what encoding='bytes' gives) rather than failing.
  void push_py2_str(std::string_view data) {
    for (char c : data) {
      if (static_cast<unsigned char>(c) >= 0x80) {
        push(Value::bytes(std::string(data)));
        return;
      }
    }
    push(Value::str(std::string(data)));
  }

  void push_utf8(std::uint64_t length) {
    std::string_view text = read_chars(length, "UTF-8 text");
    if (!is_valid_utf8(text)) fail("text is not valid UTF-8");
    push(Value::str(std::string(text)));
  }

  void push_long(std::uint64_t length) { push(Value::big_integer(std::string(read_chars(length, "int bytes")))); }

  void push_tuple(std::size_t n) {
    if (stack_.size() - frame_base() < n) fail(stack_underflow(n));
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - static_cast<std::ptrdiff_t>(n)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    push(track(Value::tuple(std::move(items))));
  }

  void append_items(const ValuePtr& target, std::vector<ValuePtr> items) {
    if (!target->is(Kind::kList) && !target->is(Kind::kObject)) {
      fail("expected a list or object to append to, found " + kind_of(target));
    }
    note_mutation(target);
    auto& dest = target->mutable_items();
    for (auto& item : items) dest.push_back(std::move(item));
  }

  void set_items(const ValuePtr& target, std::vector<ValuePtr> items) {
    if (!target->is(Kind::kDict) && !target->is(Kind::kObject)) {
      fail("expected a dict or object to set items on, found " + kind_of(target));
    }
    note_mutation(target);
    add_entries(*target, std::move(items));
  }

  void add_entries(Value& target, std::vector<ValuePtr> items) {
    if (items.size() % 2 != 0) fail("odd number of items for key/value pairs");
    auto& entries = target.mutable_entries();
    for (std::size_t i = 0; i < items.size(); i += 2) {
      entries.emplace_back(std::move(items[i]), std::move(items[i + 1]));
    }
  }

  ValuePtr make_global(std::string module, std::string name) {
    if (proto_ < 3) fix_py2_global(module, name);
    return Value::global(std::move(module), std::move(name));
  }

  // REDUCE, with the protocol 0-2 spellings of bytes, bytearray, set, frozenset and
  // NEWOBJ_EX turned back into what they stand for, so a tree does not depend on the
  // protocol it was read from (the writer spells them the same way again).
  ValuePtr reduce(ValuePtr callable, ValuePtr args) {
    if (callable->is(Kind::kGlobal)) {
      if (ValuePtr plain = reduce_builtin(*callable, args->items())) {
        // Its children came out of args, which may be reachable too.
        for (std::size_t i = 0; i < child_count(*plain); ++i) note_alias(child_at(*plain, i));
        return plain;
      }
    }
    return Value::object(CallKind::kReduce, std::move(callable), std::move(args));
  }

  static ValuePtr reduce_builtin(const Value& callable, const std::vector<ValuePtr>& args) {
    auto latin1 = [&](std::size_t n) -> std::optional<std::string> {
      if (args.size() != n + 2 || !args[n]->is(Kind::kStr)) return std::nullopt;
      if (!is_str(args[n + 1], "latin1") && !is_str(args[n + 1], "latin-1")) return std::nullopt;
      return utf8_to_latin1(args[n]->as_string());
    };
    if (callable.is_global("_codecs", "encode")) {
      if (auto data = latin1(0)) return Value::bytes(std::move(*data));
    } else if (callable.is_global("builtins", "bytes")) {
      if (args.empty()) return Value::bytes("");
    } else if (callable.is_global("builtins", "bytearray")) {
      if (args.empty()) return Value::bytearray("");
      if (args.size() == 1 && args[0]->is(Kind::kBytes)) return Value::bytearray(args[0]->as_string());
      if (auto data = latin1(0)) return Value::bytearray(std::move(*data));
    } else if (callable.is_global("builtins", "set") || callable.is_global("builtins", "frozenset")) {
      bool frozen = callable.name() == "frozenset";
      if (args.empty()) return frozen ? Value::frozenset() : Value::set();
      if (args.size() == 1 && (args[0]->is(Kind::kList) || args[0]->is(Kind::kTuple))) {
        return frozen ? Value::frozenset(args[0]->items()) : Value::set(args[0]->items());
      }
    } else if (callable.is_global("copyreg", "__newobj_ex__")) {
      if (args.size() == 3 && args[1]->is(Kind::kTuple) && args[2]->is(Kind::kDict)) {
        return Value::object(CallKind::kNewObjEx, args[0], args[1], args[2]);
      }
    }
    return nullptr;
  }

  // INST module name: MARK args INST -> an instance. CPython calls klass(*args), or
  // klass.__new__(klass) when there are no args; kept as REDUCE / NEWOBJ to match.
  void load_inst() {
    std::string module = read_utf8_line("module name");
    std::string name = read_utf8_line("class name");
    auto args = pop_mark();
    push(track(instantiate(make_global(std::move(module), std::move(name)), std::move(args))));
  }

  void load_obj() {
    auto args = pop_mark();
    if (args.empty()) fail("expected a class after MARK");
    ValuePtr cls = std::move(args.front());
    args.erase(args.begin());
    push(track(instantiate(std::move(cls), std::move(args))));
  }

  ValuePtr instantiate(ValuePtr cls, std::vector<ValuePtr> args) {
    CallKind call = args.empty() ? CallKind::kNewObj : CallKind::kReduce;
    return Value::object(call, std::move(cls), track(Value::tuple(std::move(args))));
  }

  void memo_get(std::uint64_t index) {
    const ValuePtr* found = memo_.find(index);
    if (found == nullptr) fail("memo index " + std::to_string(index) + " not found");
    note_alias(*found);
    push(*found);
  }

  void memo_put(std::uint64_t index) { memo_.put(index, top()); }

  std::uint64_t read_text_index() {
    auto le = parse_decimal_int(read_line());
    if (!le || le->size() > 8 || (!le->empty() && (static_cast<unsigned char>(le->back()) & 0x80))) {
      fail("expected a non-negative decimal memo index");
    }
    std::uint64_t index = 0;
    for (std::size_t i = 0; i < le->size(); ++i) {
      index |= std::uint64_t{static_cast<unsigned char>((*le)[i])} << (8 * i);
    }
    return index;
  }

  // --- the stack ---------------------------------------------------------------------
  std::size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }

  void push(ValuePtr v) { stack_.push_back(std::move(v)); }

  ValuePtr pop() {
    if (stack_.size() <= frame_base()) fail(stack_underflow(1));
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }

  const ValuePtr& top() {
    if (stack_.size() <= frame_base()) fail(stack_underflow(1));
    return stack_.back();
  }

  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("expected a MARK on the stack, found none");
    std::size_t base = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(base)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(base);
    return items;
  }

  std::string stack_underflow(std::size_t needed) const {
    return "stack underflow: expected " + std::to_string(needed) + " value(s) " +
           (marks_.empty() ? "on the stack" : "after the last MARK") + ", found " +
           std::to_string(stack_.size() - frame_base());
  }

  static std::string kind_of(const ValuePtr& v) { return std::string(kind_name(v->kind())); }

  // Cycle bookkeeping. A cycle needs an edge added to a node that something already
  // reaches, i.e. a mutation (APPEND(S), SETITEM(S), ADDITEMS, BUILD) of a node that has a
  // second reference: one from DUP, from the memo, or a child a builtin REDUCE took out
  // of its arguments. Without such a mutation the graph is acyclic and only aliased nodes
  // can have more than one parent, which makes the depth check a cheap walk.
  void note_alias(const ValuePtr& v) {
    if (v && has_children(v->kind())) aliased_.insert(v.get());
  }

  void note_mutation(const ValuePtr& target) {
    if (aliased_.contains(target.get())) maybe_cyclic_ = true;
  }

  ValuePtr track(ValuePtr v) {
    if (has_children(v->kind())) created_.push_back(v);
    return v;
  }

  void expect_kind(const ValuePtr& v, Kind kind, std::string_view what) {
    if (!v->is(kind)) {
      fail("expected " + std::string(what) + " (" + std::string(kind_name(kind)) + "), found " +
           std::string(kind_name(v->kind())));
    }
  }

  // --- reading arguments -------------------------------------------------------------
  std::size_t remaining() const { return data_.size() - pos_; }

  std::string_view read_chars(std::uint64_t n, std::string_view what) {
    if (n > remaining()) {
      fail("expected " + std::to_string(n) + " bytes of " + std::string(what) + ", " + std::to_string(remaining()) +
           " left");
    }
    std::string_view s(reinterpret_cast<const char*>(data_.data()) + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

  template <typename T>
  T read_le(std::string_view what) {
    std::string_view s = read_chars(sizeof(T), what);
    return get_le<T>(reinterpret_cast<const std::byte*>(s.data()));
  }

  template <typename T>
  std::uint64_t read_length() {
    return read_le<T>("length");
  }

  std::string read_bytes(std::uint64_t n) { return std::string(read_chars(n, "bytes")); }

  std::uint64_t read_signed_length() {
    auto n = static_cast<std::int32_t>(read_le<std::uint32_t>("length"));
    if (n < 0) fail("negative length " + std::to_string(n));
    return static_cast<std::uint64_t>(n);
  }

  double read_binfloat() {
    std::string_view s = read_chars(8, "big-endian float");
    std::uint64_t bits = 0;
    for (char c : s) bits = (bits << 8) | static_cast<unsigned char>(c);
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  // The text up to the next newline (excluded); the newline is consumed.
  std::string_view read_line() {
    auto begin = reinterpret_cast<const char*>(data_.data()) + pos_;
    auto newline = static_cast<const char*>(std::memchr(begin, '\n', remaining()));
    if (newline == nullptr) fail("expected a newline-terminated argument, found end of data");
    std::string_view line(begin, static_cast<std::size_t>(newline - begin));
    pos_ += line.size() + 1;
    return line;
  }

  std::string read_utf8_line(std::string_view what) {
    std::string_view line = read_line();
    if (!is_valid_utf8(line)) fail(std::string(what) + " is not valid UTF-8");
    return std::string(line);
  }

  [[noreturn]] void fail(const std::string& detail) const {
    std::string_view name = op::opcode_name(code_);
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", code_);
    throw FormatError(std::string(source_) + ": " + (name.empty() ? "opcode " + std::string(hex) : std::string(name)) +
                      " at offset " + std::to_string(op_offset_) + ": " + detail);
  }

  // --- after STOP --------------------------------------------------------------------
  ValuePtr take_ownership(const ValuePtr& root) {
    if (!maybe_cyclic_) {
      // A path through more nodes than were built would need a cycle; should one exist
      // after all, the full analysis below handles it.
      if (auto depth = acyclic_depth(root, aliased_, created_.size() + 1)) {
        check_depth(*depth);
        return root;
      }
    }
    GraphShape shape = analyze_graph(root, created_);
    check_depth(shape.depth);
    // Nodes built but dropped (popped, or only in the memo) may form cycles of their own.
    std::vector<ValuePtr> released;
    for (auto& node : shape.unreachable_watched) release_children(*node, released);
    if (shape.cyclic_nodes.empty()) return root;
    auto owner = std::make_shared<CycleOwner>();
    owner->root = root;
    owner->cyclic_nodes = std::move(shape.cyclic_nodes);
    return ValuePtr(owner, root.get());
  }

  void check_depth(std::size_t depth) const {
    if (depth > options_.max_depth) {
      throw FormatError(std::string(source_) + ": nesting depth " + std::to_string(depth) + " exceeds the limit of " +
                        std::to_string(options_.max_depth));
    }
  }

  ByteSpan data_;
  std::string_view source_;
  const ReadOptions& options_;
  std::size_t pos_ = 0;
  std::size_t op_offset_ = 0;
  std::uint8_t code_ = 0;
  int proto_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<std::size_t> marks_;
  Memo memo_;
  std::vector<ValuePtr> created_;             // every node that can hold others, for cycle cleanup
  std::unordered_set<const Value*> aliased_;  // containers with a second reference (note_alias)
  bool maybe_cyclic_ = false;
  bool succeeded_ = false;
};

}  // namespace

ValuePtr read_pickle(ByteSpan data, std::string_view source_name, const ReadOptions& options) {
  return Unpickler(data, source_name, options).run();
}

}  // namespace shardpoint::pickle
