// Fuzzes storage::Location::parse. Invariants: any input parses or throws UsageError (a
// file URL open_storage() would refuse); the result is a fixed point of
// parse(to_string(x)); a location with a parent is that parent's child of its name; a
// child keeps scheme, bucket and query.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "shardpoint/error.h"
#include "storage/location.h"

using shardpoint::UsageError;
using shardpoint::storage::Location;

namespace {

void check(bool ok, const char* what, const Location& loc) {
  if (ok) return;
  std::fprintf(stderr, "%s: \"%s\"\n", what, loc.to_string().c_str());
  std::abort();
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
  check(Location::parse(loc.to_string()) == loc, "parse(to_string(x)) != x", loc);
  check(loc.is_remote() || !loc.path().empty(), "local path is empty", loc);
  if (std::optional<Location> up = loc.parent()) {
    check(up->child(loc.name()) == loc, "parent().child(name()) != x", loc);
    check(Location::parse(up->to_string()) == *up, "parent does not round-trip", loc);
  } else {
    check(loc.name().empty(), "a location without parent has a name", loc);
  }
  const Location down = loc.child("k");
  check(down.scheme() == loc.scheme() && down.bucket() == loc.bucket() && down.query() == loc.query(),
        "child() changed scheme, bucket or query", loc);
  check(Location::parse(down.to_string()) == down, "child does not round-trip", loc);
  return 0;
}
