#include "format/checkpoint_path.h"

#include <filesystem>
#include <system_error>

#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

[[noreturn]] void escapes(const std::string& dir, std::string_view rel) {
  throw FormatError("relative_path '" + std::string(rel) + "' in .metadata escapes the checkpoint folder '" + dir +
                    "'");
}

// True when `path` is `root` or lies below it (both lexically normal, absolute).
bool is_within(const std::filesystem::path& root, const std::filesystem::path& path) {
  auto r = root.begin(), p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // trailing separator of root
    if (p == path.end() || *r != *p) return false;
  }
  return true;
}

}  // namespace

bool is_safe_relative_path(std::string_view rel) {
  if (rel.empty() || rel.front() == '/') return false;
  if (rel.find('\0') != std::string_view::npos || rel.find('\\') != std::string_view::npos) return false;
  std::size_t start = 0;
  while (true) {
    std::size_t end = rel.find('/', start);
    std::string_view part = rel.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (end == std::string_view::npos) return true;
    start = end + 1;
  }
}

std::string resolve_item_path(const std::string& checkpoint_dir, const std::string& relative_path) {
  if (relative_path.empty()) {
    throw FormatError("relative_path '' in .metadata is not a plain relative path (checkpoint folder '" +
                      checkpoint_dir + "')");
  }
  if (!is_safe_relative_path(relative_path)) {
    if (relative_path.front() == '/' || relative_path.find("..") != std::string::npos) {
      escapes(checkpoint_dir, relative_path);
    }
    throw FormatError("relative_path '" + relative_path +
                      "' in .metadata is not a plain relative path (checkpoint folder '" + checkpoint_dir + "')");
  }
  std::string joined = checkpoint_dir.empty()         ? relative_path
                       : checkpoint_dir.back() == '/' ? checkpoint_dir + relative_path
                                                      : checkpoint_dir + "/" + relative_path;
  // Symlinks: resolve both sides as far as they exist and compare.
  std::error_code ec;
  std::filesystem::path root = std::filesystem::weakly_canonical(checkpoint_dir.empty() ? "." : checkpoint_dir, ec);
  if (ec) throw_os_error("resolve", checkpoint_dir, ec.value());
  std::filesystem::path target = std::filesystem::weakly_canonical(joined, ec);
  if (ec) throw_os_error("resolve", joined, ec.value());
  if (!is_within(root, target) || root == target) escapes(checkpoint_dir, relative_path);
  return joined;
}

}  // namespace shardpoint::format
