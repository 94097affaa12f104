#include "shardpoint/storage_registry.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage {
namespace {

struct Registry {
  Mutex mu;
  std::map<std::string, OpenStorageFn, std::less<>> schemes SP_GUARDED_BY(mu);
};

// Function-local static: usable from other translation units' static initializers.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_storage_scheme(std::string_view scheme, OpenStorageFn fn) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  auto it = r.schemes.find(scheme);
  if (it != r.schemes.end()) {
    if (it->second == fn) return;
    throw UsageError("storage scheme \"" + std::string(scheme) + "\" is already registered to another driver");
  }
  r.schemes.emplace(std::string(scheme), fn);
}

std::vector<std::string> registered_storage_schemes() {
  Registry& r = registry();
  MutexLock lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [scheme, fn] : r.schemes) out.push_back(scheme);
  return out;
}

std::unique_ptr<Storage> open_storage(std::string_view url, const StorageOptions& options) {
  if (url.empty()) throw UsageError("storage URL is empty (expected a directory path or scheme://...)");
  return open_storage(Location::parse(url), options);
}

std::unique_ptr<Storage> open_storage(const Location& location, const StorageOptions& options) {
  const std::string& scheme = location.scheme_name();
  OpenStorageFn fn = nullptr;
  {
    Registry& r = registry();
    MutexLock lock(r.mu);
    auto it = r.schemes.find(scheme);
    if (it != r.schemes.end()) fn = it->second;
  }
  if (fn == nullptr) {
    std::string accepted;
    for (const std::string& s : registered_storage_schemes()) accepted += (accepted.empty() ? "" : ", ") + s + "://";
    throw UsageError("storage URL \"" + location.text() + "\": unknown scheme \"" + scheme +
                     "\" (accepted: a local path, " + accepted + ")");
  }
  return fn(location, options);
}

}  // namespace shardpoint::storage
