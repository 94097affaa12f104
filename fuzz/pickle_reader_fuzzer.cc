// libFuzzer target for the pickle layer. Beyond "no crash, no leak" (sanitizers):
//  1. read_pickle either returns a tree or throws FormatError;
//  2. repr() of any tree read works; the depth the reader enforced (its cheap walk for
//     acyclic graphs) is analyze_graph's: one level less is refused;
//  3. a tree read writes at protocols 2 and 4 (or the writer refuses it with UsageError), and
//     reading that output gives a deep_equal tree. Protocol 2 renames some globals (nested
//     names become getattr calls, Python 2 module names map to Python 3 ones, as CPython
//     does), so for trees with such globals the check is that a second rewrite is stable.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "pickle/reader.h"
#include "pickle/repr.h"
#include "pickle/value_graph.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace {

using namespace shardpoint;
using namespace shardpoint::pickle;

[[noreturn]] void invariant_broken(const char* what, int protocol) {
  std::fprintf(stderr, "pickle_reader_fuzzer: %s (protocol %d)\n", what, protocol);
  std::abort();
}

bool renamed_by_protocol_2(const Value& g) {
  const std::string& m = g.module();
  const std::string& n = g.name();
  if (n.find('.') != std::string::npos || m == "__builtin__" || m == "copy_reg" || m == "exceptions") return true;
  if (m != "builtins") return false;
  for (std::string_view py2 : {"xrange", "unicode", "long", "unichr", "reduce", "intern", "basestring"}) {
    if (n == py2) return true;
  }
  return false;
}

// Walks the graph without recursion.
bool has_renamed_global(const ValuePtr& root) {
  std::vector<const Value*> pending{root.get()};
  std::unordered_set<const Value*> seen{root.get()};
  while (!pending.empty()) {
    const Value* v = pending.back();
    pending.pop_back();
    if (v->is(Kind::kGlobal) && renamed_by_protocol_2(*v)) return true;
    for (std::size_t i = 0; i < child_count(*v); ++i) {
      const ValuePtr& child = child_at(*v, i);
      if (child && seen.insert(child.get()).second) pending.push_back(child.get());
    }
  }
  return false;
}

// Written pickles may nest deeper than their source (getattr chains), so read them back
// with a larger limit; the writer bounds their depth.
ValuePtr reread(const std::string& data, int protocol) {
  ReadOptions options;
  options.max_depth = 1 << 20;
  try {
    return read_pickle(as_bytes(data), "rewritten", options);
  } catch (const FormatError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    invariant_broken("the writer's output does not read back", protocol);
  }
}

std::optional<std::string> write_or_refuse(const Value& v, int protocol) {
  try {
    return pickle_to_string(v, WriteOptions{.protocol = protocol});
  } catch (const UsageError&) {
    return std::nullopt;
  }
}

void check_round_trip(const ValuePtr& tree, int protocol, bool renames) {
  auto written = write_or_refuse(*tree, protocol);
  if (!written) return;
  ValuePtr back = reread(*written, protocol);
  if (!renames) {
    if (!deep_equal(*tree, *back)) invariant_broken("rewritten tree differs", protocol);
    return;
  }
  auto again = write_or_refuse(*back, protocol);
  if (!again) invariant_broken("the writer refuses its own output", protocol);
  if (!deep_equal(*back, *reread(*again, protocol))) invariant_broken("second rewrite differs", protocol);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ValuePtr tree;
  try {
    tree = read_pickle(ByteSpan(reinterpret_cast<const std::byte*>(data), size), "fuzz input");
  } catch (const FormatError&) {
    return 0;
  }
  (void)repr(*tree);
  std::size_t depth = analyze_graph(tree).depth;
  if (depth > 1) {
    ReadOptions tighter;
    tighter.max_depth = depth - 1;
    bool refused = false;
    try {
      (void)read_pickle(ByteSpan(reinterpret_cast<const std::byte*>(data), size), "fuzz input", tighter);
    } catch (const FormatError&) {
      refused = true;
    }
    if (!refused) invariant_broken("a graph deeper than max_depth was accepted", 0);
  }
  bool renames = has_renamed_global(tree);
  check_round_trip(tree, 2, renames);
  check_round_trip(tree, 4, false);
  return 0;
}
