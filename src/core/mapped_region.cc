#include "core/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>

#include "core/unique_fd.h"

namespace shardpoint {

MappedRegion::~MappedRegion() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
}

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : addr_(other.addr_), size_(other.size_), path_(std::move(other.path_)) {
  other.addr_ = nullptr;
  other.size_ = 0;
}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = other.addr_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.addr_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedRegion MappedRegion::map_file(const std::string& path) {
  UniqueFd fd = UniqueFd::open(path, O_RDONLY);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw_os_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw StorageError(StorageError::Kind::kOther, path + ": not a regular file");
  }
  MappedRegion region;
  region.path_ = path;
  region.size_ = static_cast<std::size_t>(st.st_size);
  if (region.size_ > 0) {
    void* addr = ::mmap(nullptr, region.size_, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (addr == MAP_FAILED) throw_os_error("mmap", path, errno);
    region.addr_ = addr;
  }
  return region;
}

}  // namespace shardpoint
