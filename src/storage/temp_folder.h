// TempFolder: a local folder built under a temporary name next to its final path and
// published there with one rename, so readers see either no folder or the complete one.
// The temporary is "<parent>/.<name>.sp-tmp.<pid>"; a leftover of that name (a crashed
// earlier run of this pid) is removed first. Unless published, the destructor removes the
// temporary and all it holds (best effort; it cannot report).
//
// Thread-safety: one owner; not copyable.
#pragma once

#include <string>

namespace shardpoint::storage {

class TempFolder {
 public:
  // Creates the temporary next to `final_path` (a local path with a parent folder that
  // exists). Throws StorageError (throw_os_error) naming the temporary when mkdir fails.
  explicit TempFolder(const std::string& final_path);
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  // The temporary folder to build in.
  const std::string& path() const { return path_; }

  // Renames the temporary onto final_path (REQUIRES nothing is there, or an empty folder:
  // rename(2)'s rules) and, when durable, fsyncs the parent folder so the rename survives
  // a crash. Throws StorageError naming both paths when the rename fails. Call once.
  void publish(bool durable);

 private:
  std::string final_path_;
  std::string parent_;
  std::string path_;
  bool published_ = false;
};

}  // namespace shardpoint::storage
