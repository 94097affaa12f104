#include "shardpoint/pickle_value.h"

#include <cstring>
#include <set>

#include "shardpoint/error.h"

namespace shardpoint::pickle {

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kByteArray: return "bytearray";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kPersistentId: return "persistent id";
  }
  return "?";
}

// Moves every child pointer of v into out (used by the non-recursive destructor and by
// the cycle breaker of the reader).
void release_children(Value& v, std::vector<ValuePtr>& out) {
  for (auto& item : v.items_) out.push_back(std::move(item));
  v.items_.clear();
  for (auto& [k, val] : v.entries_) {
    out.push_back(std::move(k));
    out.push_back(std::move(val));
  }
  v.entries_.clear();
  for (ValuePtr* p : {&v.callable_, &v.args_, &v.kwargs_, &v.state_}) {
    if (*p) out.push_back(std::move(*p));
  }
}

Value::~Value() {
  // Tear down iteratively: children whose last owner is this node are emptied here
  // instead of in their own destructors, so depth never reaches the call stack.
  std::vector<ValuePtr> pending;
  release_children(*this, pending);
  while (!pending.empty()) {
    ValuePtr node = std::move(pending.back());
    pending.pop_back();
    if (node && node.use_count() == 1) release_children(*node, pending);
  }
}

ValuePtr Value::none() { return std::make_shared<Value>(Kind::kNone); }

ValuePtr Value::boolean(bool v) {
  auto p = std::make_shared<Value>(Kind::kBool);
  p->int_ = v ? 1 : 0;
  return p;
}

ValuePtr Value::integer(std::int64_t v) {
  auto p = std::make_shared<Value>(Kind::kInt);
  p->int_ = v;
  return p;
}

ValuePtr Value::big_integer(std::string le) {
  // Drop redundant sign-extension bytes, then store as int64 when 8 bytes suffice.
  while (le.size() > 1) {
    auto last = static_cast<unsigned char>(le[le.size() - 1]);
    auto prev = static_cast<unsigned char>(le[le.size() - 2]);
    if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) {
      le.pop_back();
    } else {
      break;
    }
  }
  if (le.size() <= 8) {
    std::uint64_t u = 0;
    for (std::size_t i = 0; i < le.size(); ++i) {
      u |= static_cast<std::uint64_t>(static_cast<unsigned char>(le[i])) << (8 * i);
    }
    if (!le.empty() && (static_cast<unsigned char>(le.back()) & 0x80)) {
      for (std::size_t i = le.size(); i < 8; ++i) u |= std::uint64_t{0xff} << (8 * i);
    }
    return integer(static_cast<std::int64_t>(u));
  }
  auto p = std::make_shared<Value>(Kind::kInt);
  p->big_ = true;
  p->text_ = std::move(le);
  return p;
}

ValuePtr Value::floating(double v) {
  auto p = std::make_shared<Value>(Kind::kFloat);
  p->float_ = v;
  return p;
}

ValuePtr Value::str(std::string utf8) {
  auto p = std::make_shared<Value>(Kind::kStr);
  p->text_ = std::move(utf8);
  return p;
}

ValuePtr Value::bytes(std::string data) {
  auto p = std::make_shared<Value>(Kind::kBytes);
  p->text_ = std::move(data);
  return p;
}

ValuePtr Value::bytearray(std::string data) {
  auto p = std::make_shared<Value>(Kind::kByteArray);
  p->text_ = std::move(data);
  return p;
}

ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kTuple);
  p->items_ = std::move(items);
  return p;
}

ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kList);
  p->items_ = std::move(items);
  return p;
}

ValuePtr Value::dict(DictEntries entries) {
  auto p = std::make_shared<Value>(Kind::kDict);
  p->entries_ = std::move(entries);
  return p;
}

ValuePtr Value::set(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kSet);
  p->items_ = std::move(items);
  return p;
}

ValuePtr Value::frozenset(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kFrozenSet);
  p->items_ = std::move(items);
  return p;
}

ValuePtr Value::global(std::string module, std::string name) {
  auto p = std::make_shared<Value>(Kind::kGlobal);
  p->text_ = std::move(module);
  p->name_ = std::move(name);
  return p;
}

ValuePtr Value::object(CallKind call, ValuePtr callable, ValuePtr args, ValuePtr kwargs) {
  auto p = std::make_shared<Value>(Kind::kObject);
  p->call_ = call;
  p->callable_ = std::move(callable);
  p->args_ = std::move(args);
  p->kwargs_ = std::move(kwargs);
  return p;
}

ValuePtr Value::call(std::string module, std::string name, std::vector<ValuePtr> args) {
  return object(CallKind::kReduce, global(std::move(module), std::move(name)), tuple(std::move(args)));
}

ValuePtr Value::persistent_id(ValuePtr pid) {
  auto p = std::make_shared<Value>(Kind::kPersistentId);
  p->callable_ = std::move(pid);
  return p;
}

void Value::expect(Kind k, const char* accessor) const {
  if (kind_ != k) {
    throw FormatError(std::string("pickle value: ") + accessor + " expects " + std::string(kind_name(k)) + ", found " +
                      std::string(kind_name(kind_)));
  }
}

bool Value::is_global(std::string_view module, std::string_view name) const {
  return kind_ == Kind::kGlobal && text_ == module && name_ == name;
}

bool Value::as_bool() const {
  expect(Kind::kBool, "as_bool");
  return int_ != 0;
}

std::int64_t Value::as_int() const {
  expect(Kind::kInt, "as_int");
  if (big_) throw FormatError("pickle value: integer does not fit in 64 bits");
  return int_;
}

std::string Value::int_le_bytes() const {
  expect(Kind::kInt, "int_le_bytes");
  if (big_) return text_;
  if (int_ == 0) return {};
  std::string out;
  std::uint64_t u = static_cast<std::uint64_t>(int_);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  // Trim sign extension to the minimal two's complement form (as Python's LONG1 does).
  while (out.size() > 1) {
    auto last = static_cast<unsigned char>(out[out.size() - 1]);
    auto prev = static_cast<unsigned char>(out[out.size() - 2]);
    if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) {
      out.pop_back();
    } else {
      break;
    }
  }
  return out;
}

double Value::as_float() const {
  expect(Kind::kFloat, "as_float");
  return float_;
}

const std::string& Value::as_string() const {
  if (kind_ != Kind::kStr && kind_ != Kind::kBytes && kind_ != Kind::kByteArray) {
    expect(Kind::kStr, "as_string");
  }
  return text_;
}

const std::vector<ValuePtr>& Value::items() const { return items_; }
std::vector<ValuePtr>& Value::mutable_items() { return items_; }
const DictEntries& Value::entries() const { return entries_; }
DictEntries& Value::mutable_entries() { return entries_; }

ValuePtr Value::get(std::string_view key) const {
  expect(Kind::kDict, "get");
  for (const auto& [k, v] : entries_) {
    if (k && k->kind_ == Kind::kStr && k->text_ == key) return v;
  }
  return nullptr;
}

const std::string& Value::module() const {
  expect(Kind::kGlobal, "module");
  return text_;
}

const std::string& Value::name() const {
  expect(Kind::kGlobal, "name");
  return name_;
}

CallKind Value::call_kind() const {
  expect(Kind::kObject, "call_kind");
  return call_;
}

const ValuePtr& Value::callable() const {
  expect(Kind::kObject, "callable");
  return callable_;
}

const ValuePtr& Value::args() const {
  expect(Kind::kObject, "args");
  return args_;
}

const ValuePtr& Value::kwargs() const {
  expect(Kind::kObject, "kwargs");
  return kwargs_;
}

const ValuePtr& Value::state() const {
  expect(Kind::kObject, "state");
  return state_;
}

void Value::set_state(ValuePtr state) {
  expect(Kind::kObject, "set_state");
  state_ = std::move(state);
}

const ValuePtr& Value::pid() const {
  expect(Kind::kPersistentId, "pid");
  return callable_;
}

namespace {

constexpr int kMaxEqualDepth = 10000;

bool equal_ptr(const ValuePtr& a, const ValuePtr& b, int depth,
               std::set<std::pair<const Value*, const Value*>>& assumed);

bool equal_node(const Value& a, const Value& b, int depth, std::set<std::pair<const Value*, const Value*>>& assumed) {
  if (a.kind() != b.kind()) return false;
  if (depth > kMaxEqualDepth) throw FormatError("pickle value: nesting too deep to compare");
  // Co-inductive step: a pair already under comparison is assumed equal (handles cycles).
  if (!assumed.insert({&a, &b}).second) return true;
  switch (a.kind()) {
    case Kind::kNone: return true;
    case Kind::kBool: return a.as_bool() == b.as_bool();
    case Kind::kInt: return a.int_le_bytes() == b.int_le_bytes();
    case Kind::kFloat: {
      double x = a.as_float(), y = b.as_float();
      return std::memcmp(&x, &y, sizeof x) == 0 || x == y;
    }
    case Kind::kStr:
    case Kind::kBytes:
    case Kind::kByteArray: return a.as_string() == b.as_string();
    case Kind::kGlobal: return a.module() == b.module() && a.name() == b.name();
    case Kind::kPersistentId: return equal_ptr(a.pid(), b.pid(), depth + 1, assumed);
    case Kind::kObject:
      if (a.call_kind() != b.call_kind()) return false;
      if (!equal_ptr(a.callable(), b.callable(), depth + 1, assumed) ||
          !equal_ptr(a.args(), b.args(), depth + 1, assumed) ||
          !equal_ptr(a.kwargs(), b.kwargs(), depth + 1, assumed) ||
          !equal_ptr(a.state(), b.state(), depth + 1, assumed)) {
        return false;
      }
      [[fallthrough]];
    default: break;
  }
  const auto& ia = a.items();
  const auto& ib = b.items();
  if (ia.size() != ib.size()) return false;
  for (std::size_t i = 0; i < ia.size(); ++i) {
    if (!equal_ptr(ia[i], ib[i], depth + 1, assumed)) return false;
  }
  const auto& ea = a.entries();
  const auto& eb = b.entries();
  if (ea.size() != eb.size()) return false;
  for (std::size_t i = 0; i < ea.size(); ++i) {
    if (!equal_ptr(ea[i].first, eb[i].first, depth + 1, assumed) ||
        !equal_ptr(ea[i].second, eb[i].second, depth + 1, assumed)) {
      return false;
    }
  }
  return true;
}

bool equal_ptr(const ValuePtr& a, const ValuePtr& b, int depth,
               std::set<std::pair<const Value*, const Value*>>& assumed) {
  if (!a || !b) return !a && !b;
  return equal_node(*a, *b, depth, assumed);
}

}  // namespace

bool deep_equal(const Value& a, const Value& b) {
  std::set<std::pair<const Value*, const Value*>> assumed;
  return equal_node(a, b, 0, assumed);
}

}  // namespace shardpoint::pickle
