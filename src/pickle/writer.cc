#include "pickle/writer.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <unordered_map>
#include <vector>

#include "pickle/opcodes.h"
#include "pickle/text_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::pickle {

namespace {

// Deepest nesting of tree nodes the writer recurses into. Above ReadOptions::max_depth
// (2000) so everything read with the defaults can be written back; small enough that the
// recursion fits an 8 MiB stack, sanitizers included (the recursive path
// save -> save_kind -> batch_* -> save_child keeps its frames small: everything else is
// kept out of line, see SP_OUT_OF_LINE).
constexpr std::size_t kMaxWriteDepth = 6000;

// Keeps a helper's locals (strings, iterators, exception messages) out of the frames of
// the recursive path; with AddressSanitizer, inlining them costs kilobytes per level.
#define SP_OUT_OF_LINE [[gnu::noinline]]

[[noreturn]] SP_OUT_OF_LINE void usage_error(std::string_view what) {
  throw UsageError("pickle writer: " + std::string(what));
}

// CPython's pickler batches APPENDS / SETITEMS / ADDITEMS by this many items.
constexpr std::size_t kBatchSize = 1000;

// Protocol 4 frames (CPython's _Framer): a frame is closed once it holds this many bytes;
// payloads this large are written outside any frame.
constexpr std::size_t kFrameSizeTarget = 64 * 1024;
// Frames smaller than this are written without a FRAME header.
constexpr std::size_t kFrameSizeMin = 4;

// Flush the pickle to the sink once this much is pending (protocol 2, or closed frames).
constexpr std::size_t kFlushBytes = 1 << 20;

// CPython's reverse fix_imports for protocol 2 (see the reader for the forward mapping).
struct GlobalRename {
  std::string_view py3_module, py3_name, py2_module, py2_name;
};
constexpr GlobalRename kNameRenames[] = {
    {"builtins", "range", "__builtin__", "xrange"},   {"builtins", "str", "__builtin__", "unicode"},
    {"builtins", "int", "__builtin__", "long"},       {"builtins", "chr", "__builtin__", "unichr"},
    {"functools", "reduce", "__builtin__", "reduce"}, {"sys", "intern", "__builtin__", "intern"},
};
constexpr std::pair<std::string_view, std::string_view> kModuleRenames[] = {{"builtins", "__builtin__"},
                                                                            {"copyreg", "copy_reg"}};

// Modules only Python 2 has: a protocol-2 reader maps them to Python 3's (the reader's
// fix_imports), so a global in one cannot be written at protocol 2 and read back as itself.
constexpr std::string_view kPy2Modules[] = {"__builtin__", "copy_reg", "exceptions"};

std::pair<std::string, std::string> py2_global(const std::string& module, const std::string& name) {
  for (const auto& r : kNameRenames) {
    if (module == r.py3_module && name == r.py3_name) return {std::string(r.py2_module), std::string(r.py2_name)};
  }
  for (const auto& [py3, py2] : kModuleRenames) {
    if (module == py3) return {std::string(py2), name};
  }
  return {module, name};
}

class Pickler {
 public:
  Pickler(ByteSink& sink, int protocol) : sink_(sink), protocol_(protocol) {}

  void run(const Value& root) {
    pending_.push_back(static_cast<char>(op::kProto));
    pending_.push_back(static_cast<char>(protocol_));
    framing_ = protocol_ >= 4;
    save(root, 1, true);  // the caller may hold other references to root
    write_op(op::kStop);
    if (framing_) commit_frame(true);
    framing_ = false;
    flush(true);
  }

 private:
  // --- dispatch ---------------------------------------------------------------------
  // `shared`: v may be referenced more than once (use_count > 1). A node with a single
  // reference is met only once, so it skips the memo (most nodes of a large tree), unless
  // it is written inside a shared node that is memoized after its children: if that node
  // is met again inside itself (a recursive tuple), its children are written again, and
  // without the memo a chain of such tuples would double the output at every level.
  void save(const Value& v, std::size_t depth, bool shared) {
    if (depth > kMaxWriteDepth) usage_error("nesting deeper than 6000 levels");
    if (!begin_save(v, shared)) return;
    save_kind(v, depth);
    end_save(v, shared);
  }

  // Commits a full frame, then writes a memo reference and returns false if v was already
  // written; otherwise marks v as being written.
  SP_OUT_OF_LINE bool begin_save(const Value& v, bool shared) {
    if (framing_) {
      commit_frame(false);
    } else {
      flush(false);
    }
    bool tracked = shared || inside_memoized_after_ > 0;
    if (tracked) {
      if (auto it = memo_.find(&v); it != memo_.end()) {
        write_get(it->second);
        return false;
      }
    }
    bool counted = false;
    if (shared) {
      check_reentry(v);
      ++in_progress_[&v];
      counted = !memoized_before_children(v);
      inside_memoized_after_ += counted ? 1 : 0;
    }
    path_.push_back({&v, tracked, false, counted});
    return true;
  }

  SP_OUT_OF_LINE void end_save(const Value& v, bool shared) {
    if (path_.back().counted) --inside_memoized_after_;
    if (shared && --in_progress_[&v] == 0) in_progress_.erase(&v);
    path_.pop_back();
  }

  bool memoized_before_children(const Value& v) const {
    return v.is(Kind::kList) || v.is(Kind::kDict) || (v.is(Kind::kSet) && protocol_ >= 4) || child_free(v.kind());
  }

  static bool child_free(Kind kind) {
    return kind != Kind::kTuple && kind != Kind::kList && kind != Kind::kDict && kind != Kind::kSet &&
           kind != Kind::kFrozenSet && kind != Kind::kObject && kind != Kind::kPersistentId;
  }

  void save_kind(const Value& v, std::size_t depth) {
    switch (v.kind()) {
      case Kind::kNone: write_op(op::kNone); return;
      case Kind::kBool: write_op(v.as_bool() ? op::kNewTrue : op::kNewFalse); return;
      case Kind::kInt: save_int(v); return;
      case Kind::kFloat: save_float(v.as_float()); return;
      case Kind::kStr: save_str_node(v); return;
      case Kind::kBytes: save_bytes(v); return;
      case Kind::kByteArray: save_bytearray(v); return;
      case Kind::kTuple: save_tuple(v, depth); return;
      case Kind::kList: save_list(v, depth); return;
      case Kind::kDict: save_dict(v, depth); return;
      case Kind::kSet:
      case Kind::kFrozenSet: save_set(v, depth); return;
      case Kind::kGlobal: save_global(v.module(), v.name(), &v, depth); return;
      case Kind::kObject: save_object(v, depth); return;
      case Kind::kPersistentId:
        save_child(v.pid(), depth);
        write_op(op::kBinPersId);
        return;
    }
  }

  // Python recurses forever (RecursionError) on a cycle made only of nodes that are
  // memoized after their children (tuples, call arguments, persistent ids). Re-entering a
  // node is fine when something on the way back to it is already in the memo.
  SP_OUT_OF_LINE void check_reentry(const Value& v) {
    if (!in_progress_.contains(&v)) return;
    std::size_t i = path_.size();
    while (i > 0 && path_[i - 1].node != &v) --i;
    for (std::size_t j = i; j < path_.size(); ++j) {
      if (path_[j].memoized) return;
    }
    usage_error("a " + std::string(kind_name(v.kind())) +
                " contains itself only through tuples, call arguments or persistent ids; "
                "Python cannot pickle that either");
  }

  // --- scalars ----------------------------------------------------------------------
  SP_OUT_OF_LINE void save_str_node(const Value& v) {
    save_str(v.as_string());
    memoize(&v);
  }

  SP_OUT_OF_LINE void save_int(const Value& v) {
    if (v.int_fits_int64()) {
      std::int64_t x = v.as_int();
      if (x >= 0 && x <= 0xFF) return write_op_arg<std::uint8_t>(op::kBinInt1, static_cast<std::uint8_t>(x));
      if (x >= 0 && x <= 0xFFFF) return write_op_arg<std::uint16_t>(op::kBinInt2, static_cast<std::uint16_t>(x));
      if (x >= INT32_MIN && x <= INT32_MAX) {
        return write_op_arg<std::uint32_t>(op::kBinInt, static_cast<std::uint32_t>(x));
      }
    }
    std::string le = v.int_le_bytes();
    if (le.size() < 256) {
      write_op_arg<std::uint8_t>(op::kLong1, static_cast<std::uint8_t>(le.size()));
    } else {
      if (le.size() > INT32_MAX) usage_error("int too large");
      write_op_arg<std::uint32_t>(op::kLong4, static_cast<std::uint32_t>(le.size()));
    }
    write(le);
  }

  SP_OUT_OF_LINE void save_float(double x) {
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    write_op(op::kBinFloat);
    for (int shift = 56; shift >= 0; shift -= 8) write_byte(static_cast<std::uint8_t>(bits >> shift));
  }

  SP_OUT_OF_LINE void save_str(std::string_view text) {
    if (!is_valid_utf8(text)) usage_error("str is not valid UTF-8");
    if (protocol_ >= 4 && text.size() < 256) {
      write_op_arg<std::uint8_t>(op::kShortBinUnicode, static_cast<std::uint8_t>(text.size()));
      write(text);
    } else if (text.size() > UINT32_MAX) {
      if (protocol_ < 4) usage_error("str of 4 GiB or more needs protocol 4");
      write_large(op::kBinUnicode8, 8, text);
    } else {
      write_large(op::kBinUnicode, 4, text);
    }
  }

  SP_OUT_OF_LINE void save_bytes(const Value& v) {
    const std::string& data = v.as_string();
    if (protocol_ < 3) {
      save_bytes_as_reduce(data);
    } else {
      save_bytes_payload(data);
    }
    memoize(&v);
  }

  // Protocol 2 has no bytes opcode; CPython writes bytes() or
  // _codecs.encode('<latin-1 text>', 'latin1'). The caller memoizes the result.
  SP_OUT_OF_LINE void save_bytes_as_reduce(const std::string& data) {
    if (data.empty()) {
      save_global("builtins", "bytes", nullptr);
      write_op(op::kEmptyTuple);
    } else {
      save_global("_codecs", "encode", nullptr);
      save_str(latin1_to_utf8(data));
      memoize(nullptr);
      save_named_str('c', "latin1");
      write_op(op::kTuple2);
      memoize(nullptr);
    }
    write_op(op::kReduce);
  }

  // Below protocol 5 CPython writes bytearray(b'...') as REDUCE(bytearray, (bytes,)).
  SP_OUT_OF_LINE void save_bytearray(const Value& v) {
    const std::string& data = v.as_string();
    save_global("builtins", "bytearray", nullptr);
    if (data.empty()) {
      write_op(op::kEmptyTuple);
    } else {
      if (protocol_ < 3) {
        save_bytes_as_reduce(data);
      } else {
        save_bytes_payload(data);
      }
      memoize(nullptr);
      write_op(op::kTuple1);
      memoize(nullptr);
    }
    write_op(op::kReduce);
    memoize(&v);
  }

  SP_OUT_OF_LINE void save_bytes_payload(const std::string& data) {
    if (data.size() < 256) {
      write_op_arg<std::uint8_t>(op::kShortBinBytes, static_cast<std::uint8_t>(data.size()));
      write(data);
    } else if (data.size() > UINT32_MAX) {
      write_large(op::kBinBytes8, 8, data);
    } else {
      write_large(op::kBinBytes, 4, data);
    }
  }

  // --- containers -------------------------------------------------------------------
  // Each container kind has its own out-of-line function, so a level of the recursion
  // carries only the frame of the kind it writes.
  SP_OUT_OF_LINE void save_list(const Value& v, std::size_t depth) {
    write_op(op::kEmptyList);
    memoize(&v);
    batch_appends(v.items(), depth, true);
  }

  SP_OUT_OF_LINE void save_dict(const Value& v, std::size_t depth) {
    write_op(op::kEmptyDict);
    memoize(&v);
    batch_setitems(v.entries(), depth, true);
  }

  SP_OUT_OF_LINE void save_tuple(const Value& v, std::size_t depth) {
    const auto& items = v.items();
    if (items.empty()) {
      write_op(op::kEmptyTuple);
      return;
    }
    if (items.size() <= 3) {
      for (const auto& item : items) save_child(item, depth);
      if (recalled_after_children(v, items.size(), false)) return;
      static constexpr std::uint8_t kTupleN[] = {0, op::kTuple1, op::kTuple2, op::kTuple3};
      write_op(kTupleN[items.size()]);
    } else {
      write_op(op::kMark);
      for (const auto& item : items) save_child(item, depth);
      if (recalled_after_children(v, 0, true)) return;
      write_op(op::kTuple);
    }
    memoize(&v);
  }

  // A node saved while its children were being saved (a recursive tuple or object) is
  // fetched from the memo; what was pushed for it here is dropped, as CPython does.
  SP_OUT_OF_LINE bool recalled_after_children(const Value& v, std::size_t pushed, bool pop_mark) {
    if (!path_.back().tracked) return false;  // met only once: cannot have been written inside
    auto it = memo_.find(&v);
    if (it == memo_.end()) return false;
    if (pop_mark) {
      write_op(op::kPopMark);
    } else {
      for (std::size_t i = 0; i < pushed; ++i) write_op(op::kPop);
    }
    write_get(it->second);
    return true;
  }

  SP_OUT_OF_LINE void save_set(const Value& v, std::size_t depth) {
    bool frozen = v.is(Kind::kFrozenSet);
    if (protocol_ < 4) {
      // CPython: REDUCE(set, (list(items),)), the temporary list memoized too.
      begin_set_reduce(frozen);
      batch_appends(v.items(), depth, true);
      write_op(op::kTuple1);
      memoize(nullptr);
      write_op(op::kReduce);
      if (recalled_after_children(v, 1, false)) return;
      memoize(&v);
    } else if (!frozen) {
      write_op(op::kEmptySet);
      memoize(&v);
      batch_additems(v.items(), depth);
    } else {
      write_op(op::kMark);
      for (const auto& item : v.items()) save_child(item, depth);
      if (recalled_after_children(v, 0, true)) return;
      write_op(op::kFrozenSet);
      memoize(&v);
    }
  }

  SP_OUT_OF_LINE void begin_set_reduce(bool frozen) {
    save_global("builtins", frozen ? "frozenset" : "set", nullptr);
    write_op(op::kEmptyList);
    memoize(nullptr);
  }

  // Batching follows CPython's C pickler (what pickle.dumps and torch.save run): an exact
  // list or dict of one item uses APPEND / SETITEM; otherwise every batch, even a last one
  // of one item, is MARK ... APPENDS / SETITEMS, and a dict or set whose size is a multiple
  // of the batch size ends with an empty batch. Items added to an object (an iterator in
  // CPython) use APPEND / SETITEM for a last batch of one, and no empty batch.
  void batch_appends(const std::vector<ValuePtr>& items, std::size_t depth, bool exact_list) {
    if (exact_list && items.size() == 1) {
      save_child(items[0], depth);
      write_op(op::kAppend);
      return;
    }
    for (std::size_t start = 0; start < items.size(); start += kBatchSize) {
      std::size_t n = std::min(kBatchSize, items.size() - start);
      if (n == 1 && !exact_list) {
        save_child(items[start], depth);
        write_op(op::kAppend);
        continue;
      }
      write_op(op::kMark);
      for (std::size_t i = start; i < start + n; ++i) save_child(items[i], depth);
      write_op(op::kAppends);
    }
  }

  void batch_setitems(const DictEntries& entries, std::size_t depth, bool exact_dict) {
    if (entries.empty()) return;
    if (exact_dict && entries.size() == 1) {
      save_child(entries[0].first, depth);
      save_child(entries[0].second, depth);
      write_op(op::kSetItem);
      return;
    }
    std::size_t start = 0, n = 0;
    do {
      n = std::min(kBatchSize, entries.size() - start);
      if (n == 0 && !exact_dict) break;
      if (n == 1 && !exact_dict) {
        save_child(entries[start].first, depth);
        save_child(entries[start].second, depth);
        write_op(op::kSetItem);
        break;
      }
      write_op(op::kMark);
      for (std::size_t i = start; i < start + n; ++i) {
        save_child(entries[i].first, depth);
        save_child(entries[i].second, depth);
      }
      write_op(op::kSetItems);
      start += n;
    } while (n == kBatchSize);
  }

  void batch_additems(const std::vector<ValuePtr>& items, std::size_t depth) {
    if (items.empty()) return;
    std::size_t start = 0, n = 0;
    do {
      n = std::min(kBatchSize, items.size() - start);
      write_op(op::kMark);
      for (std::size_t i = start; i < start + n; ++i) save_child(items[i], depth);
      write_op(op::kAddItems);
      start += n;
    } while (n == kBatchSize);
  }

  void save_child(const ValuePtr& child, std::size_t depth) {
    if (!child) usage_error("null child value");
    save(*child, depth + 1, child.use_count() > 1);
  }

  // --- globals and objects ----------------------------------------------------------
  // `node` is the tree node (memoized by identity too), or null for globals the writer
  // makes up (bytes, set, ...). Globals are memoized by name, as CPython's memo holds the
  // one class object.
  SP_OUT_OF_LINE void save_global(const std::string& module, const std::string& name, const Value* node,
                                  std::size_t depth = 0) {
    std::string key = module + '\n' + name;
    if (auto it = global_memo_.find(key); it != global_memo_.end()) {
      write_get(it->second);
      return;
    }
    if (protocol_ >= 4) {
      save_named_str('m', module);
      save_named_str('n', name);
      write_op(op::kStackGlobal);
    } else if (name.find('.') != std::string::npos) {
      save_nested_global_p2(module, name, depth);
    } else {
      if (std::find(std::begin(kPy2Modules), std::end(kPy2Modules), module) != std::end(kPy2Modules)) {
        usage_error("global in a Python 2 module, read back as Python 3's at protocol 2: " + module + "." + name);
      }
      auto [py2_module, py2_name] = py2_global(module, name);
      if (py2_module.find('\n') != std::string::npos || py2_name.find('\n') != std::string::npos) {
        usage_error("global name with a newline: " + module + "." + name);
      }
      write_op(op::kGlobal);
      write(py2_module + '\n' + py2_name + '\n');
    }
    std::uint64_t index = memoize(node);
    global_memo_.emplace(std::move(key), index);
  }

  // Protocol 2 looks a name up with a single getattr, so CPython writes module.A.B.c as
  // getattr(getattr(A, 'B'), 'c'). Written without recursion: the getattr references for
  // every level first, then the deepest prefix already known (or the plain global), then
  // one (name, TUPLE2, REDUCE) per level. The caller memoizes the full name.
  SP_OUT_OF_LINE void save_nested_global_p2(const std::string& module, const std::string& name, std::size_t depth) {
    std::vector<std::size_t> dots;
    for (std::size_t i = name.find('.'); i != std::string::npos; i = name.find('.', i + 1)) dots.push_back(i);
    if (depth + 2 * dots.size() > kMaxWriteDepth) {
      usage_error("global name nested too deeply for protocol 2: " + module + "." + name.substr(0, 100));
    }
    // Levels below `known` (a prefix ending before dots[known]) are already in the memo.
    std::size_t known = dots.size();
    while (known > 0 && !global_memo_.contains(module + '\n' + name.substr(0, dots[known - 1]))) --known;
    std::size_t base_end = known == 0 ? dots[0] : dots[known - 1];
    for (std::size_t level = std::max<std::size_t>(known, 1); level <= dots.size(); ++level) {
      save_global("builtins", "getattr", nullptr);
    }
    save_global(module, name.substr(0, base_end), nullptr);
    for (std::size_t level = std::max<std::size_t>(known, 1); level <= dots.size(); ++level) {
      std::size_t end = level < dots.size() ? dots[level] : name.size();
      save_str(name.substr(dots[level - 1] + 1, end - dots[level - 1] - 1));
      memoize(nullptr);
      write_op(op::kTuple2);
      memoize(nullptr);
      write_op(op::kReduce);
      if (level < dots.size()) global_memo_.emplace(module + '\n' + name.substr(0, end), memoize(nullptr));
    }
  }

  // A str the writer makes up (module and global names, 'latin1'): written once per role,
  // then fetched, as CPython's memo holds one str object per module name, per class name
  // and for its 'latin1' constant.
  SP_OUT_OF_LINE void save_named_str(char role, const std::string& text) {
    std::string key = role + text;
    if (auto it = str_memo_.find(key); it != str_memo_.end()) {
      write_get(it->second);
      return;
    }
    save_str(text);
    str_memo_.emplace(std::move(key), memoize(nullptr));
  }

  SP_OUT_OF_LINE void save_object(const Value& v, std::size_t depth) {
    check_object(v);
    switch (v.call_kind()) {
      case CallKind::kReduce:
        save_child(v.callable(), depth);
        save_child(v.args(), depth);
        write_op(op::kReduce);
        break;
      case CallKind::kNewObj:
        save_child(v.callable(), depth);
        save_child(v.args(), depth);
        write_op(op::kNewObj);
        break;
      case CallKind::kNewObjEx: save_newobj_ex(v, depth); break;
    }
    if (recalled_after_children(v, 1, false)) return;
    memoize(&v);
    batch_appends(v.items(), depth, false);
    batch_setitems(v.entries(), depth, false);
    if (v.state()) {
      save_child(v.state(), depth);
      write_op(op::kBuild);
    }
  }

  SP_OUT_OF_LINE static void check_object(const Value& v) {
    if (!v.callable()) usage_error("object without a callable");
    if (!v.args() || !v.args()->is(Kind::kTuple)) usage_error("object arguments must be a tuple");
    if (v.kwargs() && v.call_kind() != CallKind::kNewObjEx) usage_error("keyword arguments need CallKind::kNewObjEx");
    if (v.call_kind() == CallKind::kNewObjEx && (!v.kwargs() || !v.kwargs()->is(Kind::kDict))) {
      usage_error("NEWOBJ_EX keyword arguments must be a dict");
    }
  }

  // Protocol 2 has no NEWOBJ_EX; CPython >= 3.6 spells it copyreg.__newobj_ex__(cls,
  // args, kwargs), which the reader turns back into NEWOBJ_EX.
  SP_OUT_OF_LINE void save_newobj_ex(const Value& v, std::size_t depth) {
    if (protocol_ >= 4) {
      save_child(v.callable(), depth);
      save_child(v.args(), depth);
      save_child(v.kwargs(), depth);
      write_op(op::kNewObjEx);
      return;
    }
    save_global("copyreg", "__newobj_ex__", nullptr);
    save_child(v.callable(), depth);
    save_child(v.args(), depth);
    save_child(v.kwargs(), depth);
    write_op(op::kTuple3);
    memoize(nullptr);
    write_op(op::kReduce);
  }

  // --- memo -------------------------------------------------------------------------
  // Gives the value on top of the stack the next memo index; `node` may be null for
  // values that exist only in the pickle.
  SP_OUT_OF_LINE std::uint64_t memoize(const Value* node) {
    std::uint64_t index = next_memo_++;
    if (protocol_ >= 4) {
      write_op(op::kMemoize);
    } else if (index < 256) {
      write_op_arg<std::uint8_t>(op::kBinPut, static_cast<std::uint8_t>(index));
    } else {
      if (index > UINT32_MAX) usage_error("more than 2^32 memo entries");
      write_op_arg<std::uint32_t>(op::kLongBinPut, static_cast<std::uint32_t>(index));
    }
    if (node != nullptr) {
      // node is the one being written (top of path_).
      path_.back().memoized = true;
      if (path_.back().tracked) memo_.emplace(node, index);
    }
    return index;
  }

  SP_OUT_OF_LINE void write_get(std::uint64_t index) {
    if (index < 256) {
      write_op_arg<std::uint8_t>(op::kBinGet, static_cast<std::uint8_t>(index));
    } else {
      write_op_arg<std::uint32_t>(op::kLongBinGet, static_cast<std::uint32_t>(index));
    }
  }

  // --- output -----------------------------------------------------------------------
  SP_OUT_OF_LINE void write_op(std::uint8_t code) { write_byte(code); }
  void write_byte(std::uint8_t b) { current().push_back(static_cast<char>(b)); }
  void write(std::string_view s) { current().append(s); }

  template <typename T>
  SP_OUT_OF_LINE void write_op_arg(std::uint8_t code, T arg) {
    std::string& out = current();
    out.push_back(static_cast<char>(code));
    put_le<T>(out, arg);
  }

  // Opcode, little-endian length of `length_bytes`, payload. With framing, a payload of
  // kFrameSizeTarget or more goes outside any frame, as CPython writes it.
  SP_OUT_OF_LINE void write_large(std::uint8_t code, int length_bytes, std::string_view payload) {
    if (framing_ && payload.size() >= kFrameSizeTarget) commit_frame(true);
    std::string& out = (framing_ && payload.size() >= kFrameSizeTarget) ? pending_ : current();
    out.push_back(static_cast<char>(code));
    if (length_bytes == 8) {
      put_le<std::uint64_t>(out, payload.size());
    } else {
      put_le<std::uint32_t>(out, static_cast<std::uint32_t>(payload.size()));
    }
    out.append(payload);
    flush(false);
  }

  std::string& current() { return framing_ ? frame_ : pending_; }

  SP_OUT_OF_LINE void commit_frame(bool force) {
    if (frame_.empty() || (!force && frame_.size() < kFrameSizeTarget)) return;
    if (frame_.size() >= kFrameSizeMin) {
      pending_.push_back(static_cast<char>(op::kFrame));
      put_le<std::uint64_t>(pending_, frame_.size());
    }
    pending_ += frame_;
    frame_.clear();
    flush(false);
  }

  SP_OUT_OF_LINE void flush(bool all) {
    if (!all && pending_.size() < kFlushBytes) return;
    sink_.write(pending_);
    pending_.clear();
  }

  ByteSink& sink_;
  int protocol_;
  bool framing_ = false;
  std::string pending_;  // bytes ready for the sink
  std::string frame_;    // protocol 4: the open frame
  std::uint64_t next_memo_ = 0;
  std::unordered_map<const Value*, std::uint64_t> memo_;
  std::unordered_map<std::string, std::uint64_t> global_memo_;
  std::unordered_map<std::string, std::uint64_t> str_memo_;
  // The nodes being written, outermost first.
  struct PathEntry {
    const Value* node;
    bool tracked;   // may be met again: looked up in and added to memo_
    bool memoized;  // has its memo index (lists, dicts, sets do before their children)
    bool counted;   // counted in inside_memoized_after_
  };
  std::vector<PathEntry> path_;
  std::unordered_map<const Value*, int> in_progress_;  // shared nodes on path_
  int inside_memoized_after_ = 0;                      // shared nodes on path_ memoized only after their children
};

}  // namespace

void write_pickle(const Value& root, ByteSink& out, const WriteOptions& options) {
  if (options.protocol != 2 && options.protocol != 4) {
    throw UsageError("pickle writer: protocol " + std::to_string(options.protocol) + " not supported (use 2 or 4)");
  }
  Pickler(out, options.protocol).run(root);
}

std::string pickle_to_string(const Value& root, const WriteOptions& options) {
  StringSink sink;
  write_pickle(root, sink, options);
  return sink.take();
}

}  // namespace shardpoint::pickle
