#include "storage/storage_registry.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "core/error.h"
#include "storage/azure/azure_storage.h"
#include "storage/local_storage.h"
#include "storage/memory_storage.h"
#include "storage/storage.h"
#ifdef SHARDPOINT_HAVE_OBJECT_STORES
#include "storage/gcs/gcs_storage.h"
#include "storage/s3/s3_storage.h"
#endif

namespace shardpoint::storage {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, OpenStorageFn, std::less<>> schemes;
};

// Function-local static: usable from other translation units' static initializers.
Registry& registry() {
  static Registry r;
  return r;
}

// "s3://b/p" -> "s3". A string without "://", or whose part before it is not a scheme
// (letters, digits, + - .), is a local path.
std::string scheme_of(std::string_view url) {
  std::size_t pos = url.find("://");
  if (pos == std::string_view::npos || pos == 0) return "file";
  std::string scheme(url.substr(0, pos));
  bool valid = std::isalpha(static_cast<unsigned char>(scheme[0])) &&
               std::all_of(scheme.begin(), scheme.end(), [](char c) {
                 return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
               });
  if (!valid) return "file";
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  return scheme;
}

}  // namespace

void register_storage_scheme(std::string_view scheme, OpenStorageFn fn) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.schemes.find(scheme);
  if (it != r.schemes.end()) {
    if (it->second == fn) return;
    throw UsageError("storage scheme \"" + std::string(scheme) + "\" is already registered to another driver");
  }
  r.schemes.emplace(std::string(scheme), fn);
}

void register_builtin_storage() {
  // Referencing the driver functions here is what keeps their object files (and their
  // StorageRegistration constants) in a static link.
  register_storage_scheme("file", &open_local_storage);
  register_storage_scheme("memory", &open_memory_storage);
  register_storage_scheme("az", &azure::open_azure_storage);
  register_storage_scheme("abfs", &azure::open_azure_storage);
  register_storage_scheme("abfss", &azure::open_azure_storage);
#ifdef SHARDPOINT_HAVE_OBJECT_STORES
  register_storage_scheme("s3", &s3::open_s3_storage);
  register_storage_scheme("gs", &gcs::open_gcs_storage);
#endif
}

std::vector<std::string> registered_storage_schemes() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [scheme, fn] : r.schemes) out.push_back(scheme);
  return out;
}

std::unique_ptr<Storage> open_storage(std::string_view url, const StorageOptions& options) {
  register_builtin_storage();
  if (url.empty()) throw UsageError("storage URL is empty (expected a directory path or scheme://...)");
  std::string scheme = scheme_of(url);
  OpenStorageFn fn = nullptr;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.schemes.find(scheme);
    if (it != r.schemes.end()) fn = it->second;
  }
  if (fn == nullptr) {
    std::string accepted;
    for (const std::string& s : registered_storage_schemes()) accepted += (accepted.empty() ? "" : ", ") + s + "://";
    throw UsageError("storage URL \"" + std::string(url) + "\": unknown scheme \"" + scheme +
                     "\" (accepted: a local path, " + accepted + ")");
  }
  return fn(url, options);
}

}  // namespace shardpoint::storage
