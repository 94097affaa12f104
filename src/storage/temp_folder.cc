#include "storage/temp_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/unique_fd.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"

namespace shardpoint::storage {

TempFolder::TempFolder(const std::string& final_path) : final_path_(final_path) {
  const Location location = Location::parse(final_path);
  parent_ = location.parent().value_or(Location()).to_string();
  path_ = parent_ + "/." + location.name() + ".sp-tmp." + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (::mkdir(path_.c_str(), 0777) != 0) throw_os_error("mkdir", path_, errno);
}

TempFolder::~TempFolder() {
  if (!published_) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

void TempFolder::publish(bool durable) {
  if (::rename(path_.c_str(), final_path_.c_str()) != 0) {
    throw_os_error("rename", path_ + " -> " + final_path_, errno);
  }
  published_ = true;
  if (durable) {
    int fd = ::open(parent_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      UniqueFd dir(fd, parent_);
      ::fsync(fd);
    }
  }
}

}  // namespace shardpoint::storage
