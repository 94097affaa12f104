// A read-only memory mapping of a whole file (RAII: unmapped on destruction).
//
// Used by readers to use STORED zip records in place without copying. An empty file maps
// to an empty span. Move-only; the bytes stay valid while the MappedRegion lives.
// Thread-safe for concurrent reads.
#pragma once

#include <cstddef>
#include <string>

#include "core/byte_io.h"

namespace shardpoint {

class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion();
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps path read-only. Throws StorageError (missing file, not a regular file, mmap failure).
  static MappedRegion map_file(const std::string& path);

  ByteSpan bytes() const { return {static_cast<const std::byte*>(addr_), size_}; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void* addr_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace shardpoint
