// What every file of the C API shares: turning the engine's exceptions into an sp_status
// and a message (nothing is thrown across the boundary), checked C arguments, malloc'd
// strings for the caller, size-versioned structs read and written, and the engine values
// several calls hand across (enums, a blob's place).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/c_api.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/metadata.h"

namespace shardpoint::capi {

// A malloc'd copy of s (NUL-terminated), or nullptr when out of memory.
inline char* copy_string(std::string_view s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return nullptr;
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

// copy_string, throwing std::bad_alloc instead of returning nullptr.
inline char* copy_string_or_throw(std::string_view s) {
  char* p = copy_string(s);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

inline void set_error(char** error, std::string_view message) {
  if (error != nullptr) *error = copy_string(message);
}

// Runs fn, mapping the engine's exceptions to statuses (shardpoint/error.h's hierarchy).
template <typename Fn>
sp_status guarded(char** error, Fn&& fn) {
  try {
    fn();
    return SP_OK;
  } catch (const StorageError& e) {
    set_error(error, e.what());
    return e.kind() == StorageError::Kind::kNotFound ? SP_ERROR_NOT_FOUND : SP_ERROR_STORAGE;
  } catch (const FormatError& e) {
    set_error(error, e.what());
    return SP_ERROR_FORMAT;
  } catch (const PlanError& e) {
    set_error(error, e.what());
    return SP_ERROR_PLAN;
  } catch (const UsageError& e) {
    set_error(error, e.what());
    return SP_ERROR_USAGE;
  } catch (const CommError& e) {
    set_error(error, e.what());
    return SP_ERROR_COMM;
  } catch (const std::bad_alloc&) {
    set_error(error, "out of memory");
    return SP_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    set_error(error, e.what());
    return SP_ERROR_INTERNAL;
  } catch (...) {
    set_error(error, "unknown error");
    return SP_ERROR_INTERNAL;
  }
}

inline void require(bool ok, const char* what) {
  if (!ok) throw UsageError(std::string("shardpoint C API: ") + what);
}

inline std::string str(const char* s, const char* what) {
  require(s != nullptr, what);
  return s;
}

// A path or URL argument, parsed where it enters the library (shardpoint/location.h).
// UsageError for NULL (naming `what`) and for "" (open_storage's words).
inline Location location_arg(const char* s, const char* what) {
  require(s != nullptr, what);
  if (*s == '\0') throw UsageError("storage URL is empty (expected a directory path or scheme://...)");
  return Location::parse(s);
}

// Sets *s to its zero value with struct_size = sizeof(T), what every *_init starts from.
// False (and nothing done) for NULL.
template <typename T>
bool reset_sized(T* s) {
  if (s == nullptr) return false;
  *s = T{};
  s->struct_size = sizeof(T);
  return true;
}

// The caller's options struct over the defaults `init` sets: the first struct_size bytes
// come from `in` (a program built against an older, smaller struct), the rest are defaults.
// `in` may be NULL (all defaults).
template <typename Options>
Options read_options(const Options* in, void (*init)(Options*)) {
  Options o;
  init(&o);
  if (in != nullptr) {
    require(in->struct_size >= sizeof(in->struct_size), "options struct_size too small");
    std::memcpy(&o, in, std::min(in->struct_size, sizeof(o)));
    o.struct_size = sizeof(o);
  }
  return o;
}

// Writes `full` into the caller's result struct, at most out->struct_size bytes of it (a
// caller built against an older, smaller struct gets the fields it knows), keeping the
// caller's struct_size.
template <typename Result>
void write_result(Result* out, Result full) {
  const std::size_t size = std::min(out->struct_size, sizeof(full));
  full.struct_size = out->struct_size;
  std::memcpy(out, &full, size);
}

inline sp_checksum checksum_value(engine::ChecksumAlgorithm a) {
  switch (a) {
    case engine::ChecksumAlgorithm::kNone: return SP_CHECKSUM_NONE;
    case engine::ChecksumAlgorithm::kCrc32c: return SP_CHECKSUM_CRC32C;
    case engine::ChecksumAlgorithm::kXxh3: return SP_CHECKSUM_XXH3;
  }
  return SP_CHECKSUM_NONE;
}

inline sp_checkpoint_format checkpoint_format_value(engine::CheckpointKind kind) {
  switch (kind) {
    case engine::CheckpointKind::kDcp: return SP_CHECKPOINT_DCP;
    case engine::CheckpointKind::kHfSafetensors: return SP_CHECKPOINT_HF_SAFETENSORS;
    case engine::CheckpointKind::kTorchSave: return SP_CHECKPOINT_TORCH;
  }
  return SP_CHECKPOINT_DCP;
}

// A view of `info` for the caller: the strings stay `info`'s, the descriptor pointers go
// into `descriptors`, which must outlive the view (and not grow after).
inline sp_storage_info storage_info_view(const format::StorageInfo& info, std::vector<const char*>& descriptors) {
  descriptors.clear();
  for (const std::string& d : info.transform_descriptors) descriptors.push_back(d.c_str());
  return sp_storage_info{info.relative_path.c_str(), info.offset, info.length, descriptors.size(),
                         descriptors.empty() ? nullptr : descriptors.data()};
}

// The caller's sp_storage_info as the engine's value; UsageError naming `what` for NULLs.
inline format::StorageInfo storage_info_of(const sp_storage_info& in, const std::string& what) {
  format::StorageInfo out;
  require(in.file != nullptr, (what + ": storage file is NULL").c_str());
  out.relative_path = in.file;
  out.offset = in.offset;
  out.length = in.length;
  require(in.transform_descriptor_count == 0 || in.transform_descriptors != nullptr,
          (what + ": transform_descriptors is NULL").c_str());
  for (std::size_t i = 0; i < in.transform_descriptor_count; ++i) {
    out.transform_descriptors.push_back(
        str(in.transform_descriptors[i], (what + ": a transform descriptor is NULL").c_str()));
  }
  return out;
}

}  // namespace shardpoint::capi
