// Fuzzes Location::parse (shardpoint/location.h), the one URL parser. Invariants: any input
// parses or throws UsageError (a file URL open_storage() would refuse); the result is a
// fixed point of parse(to_string(x)), part by part (scheme, authority, path, query); a
// location with a parent is that parent's child of its name; a child keeps scheme,
// authority and query; query_options() returns or throws UsageError.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "shardpoint/error.h"
#include "shardpoint/location.h"

using shardpoint::Location;
using shardpoint::UsageError;

namespace {

void check(bool ok, const char* what, const Location& loc) {
  if (ok) return;
  std::fprintf(stderr, "%s: \"%s\"\n", what, loc.to_string().c_str());
  std::abort();
}

bool same_parts(const Location& a, const Location& b) {
  return a.scheme() == b.scheme() && a.scheme_name() == b.scheme_name() && a.authority() == b.authority() &&
         a.path() == b.path() && a.query() == b.query();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Location loc;
  try {
    loc = Location::parse(text);
  } catch (const UsageError&) {
    return 0;
  }
  const Location again = Location::parse(loc.to_string());
  check(again == loc && same_parts(again, loc), "parse(to_string(x)) != x", loc);
  check(!again.dropped_segments(), "a canonical text has dropped segments", loc);
  if (loc.scheme() != shardpoint::Scheme::kOther) {
    check(loc.scheme() == shardpoint::Scheme::kFile ? !loc.is_remote() : loc.is_remote(), "scheme vs is_remote", loc);
  }
  try {
    (void)loc.query_options();
  } catch (const UsageError&) {
    // A query that is not KEY=VALUE pairs: drivers refuse it when opened.
  }
  check(loc.is_remote() || !loc.path().empty(), "local path is empty", loc);
  if (std::optional<Location> up = loc.parent()) {
    check(up->child(loc.name()) == loc, "parent().child(name()) != x", loc);
    check(Location::parse(up->to_string()) == *up, "parent does not round-trip", loc);
  } else {
    check(loc.name().empty(), "a location without parent has a name", loc);
  }
  const Location down = loc.child("k");
  check(down.scheme() == loc.scheme() && down.scheme_name() == loc.scheme_name() &&
            down.authority() == loc.authority() && down.query() == loc.query(),
        "child() changed scheme, authority or query", loc);
  check(Location::parse(down.to_string()) == down, "child does not round-trip", loc);
  return 0;
}
