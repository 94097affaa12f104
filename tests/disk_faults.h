// The environment of the full-disk and lost-permission tests (docs/durability.md §8): a
// size-limited tmpfs that a test mounts for itself, the command prefix that runs a process
// without root's permission bypass, and what a folder holds afterwards.
//
// Mounting needs CAP_SYS_ADMIN (tests run as root here and in CI); where it is refused the
// test skips with the reason (SP_MOUNT_OR_SKIP).
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace shardpoint::testing {

// The user and group an unprivileged run takes (nobody/nogroup).
constexpr int kNobody = 65534;

// The OS error texts (strerror) the one-line errors must carry.
inline constexpr const char* kNoSpace = "No space left on device";
inline constexpr const char* kDenied = "Permission denied";

// A tmpfs of `bytes` (rounded up to pages) mounted on a fresh folder, owned by nobody so an
// unprivileged process may write there too; unmounted and removed on destruction.
class SizeLimitedMount {
 public:
  explicit SizeLimitedMount(std::uint64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0755,uid=" + std::to_string(kNobody) +
                                ",gid=" + std::to_string(kNobody);
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      error_ = "mount -t tmpfs -o " + options + " " + dir_.path().string() + ": " + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SizeLimitedMount() {
    if (mounted_ && ::umount2(dir_.path().c_str(), MNT_DETACH) != 0) {
      ADD_FAILURE() << "umount " << dir_.path() << ": " << std::strerror(errno);
    }
  }
  SizeLimitedMount(const SizeLimitedMount&) = delete;
  SizeLimitedMount& operator=(const SizeLimitedMount&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }  // why mounting failed
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

// Declares SizeLimitedMount `var` of `bytes`; skips the test when mounting is not permitted.
#define SP_MOUNT_OR_SKIP(var, bytes)                  \
  ::shardpoint::testing::SizeLimitedMount var(bytes); \
  if (!var.mounted()) GTEST_SKIP() << "needs a size-limited tmpfs (run as root): " << var.error()

// The tmpfs page: files take whole pages of a mount's size.
inline std::uint64_t page_bytes() { return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)); }
inline std::uint64_t pages_of(std::uint64_t bytes) { return (bytes + page_bytes() - 1) / page_bytes() * page_bytes(); }

// Runs the rest of a command line as nobody with every capability dropped, so permission
// bits apply as they do to any user (root's CAP_DAC_OVERRIDE would ignore them).
inline std::string as_nobody() {
  return "setpriv --reuid=" + std::to_string(kNobody) + " --regid=" + std::to_string(kNobody) +
         " --clear-groups --inh-caps=-all --bounding-set=-all ";
}

// Every path under `dir` (files, folders, hidden ones), relative to it, sorted.
inline std::vector<std::string> entries_under(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(std::filesystem::relative(it->path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The regular files under `dir`, relative to it, sorted.
inline std::vector<std::string> files_under(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const std::string& e : entries_under(dir)) {
    if (std::filesystem::is_regular_file(dir / e)) out.push_back(e);
  }
  return out;
}

inline std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "(nothing)" : out;
}

}  // namespace shardpoint::testing
