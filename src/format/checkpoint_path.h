// Path safety for the file names a `.metadata` refers to.
//
// `_StorageInfo.relative_path` comes from the checkpoint itself, so a hostile checkpoint
// could name "../../etc/passwd" or "/etc/passwd". Every item path goes through one of these
// functions before it is opened:
//   is_safe_relative_path - pure string check, for object stores (keys under a prefix);
//   resolve_item_path     - the string check plus, for a local folder, a realpath check
//                           that symlinks inside the folder do not lead out of it.
// PyTorch writes plain names such as "__0_0.distcp"; sub-folders ("a/b.distcp") are
// accepted, anything else is refused.
//
// Thread-safety: reentrant.
#pragma once

#include <string>
#include <string_view>

namespace shardpoint::format {

// True when `relative_path` is a non-empty relative path made of normal components: no
// leading '/', no empty, "." or ".." component (so no "a//b", "a/./b", trailing '/'), no
// backslash (a Windows separator elsewhere) and no NUL byte.
bool is_safe_relative_path(std::string_view relative_path);

// Returns checkpoint_dir + "/" + relative_path after checking that the result stays inside
// checkpoint_dir: the string check above, then the real path of the result (symlinks
// resolved as far as the path exists) must lie below the real path of checkpoint_dir.
// Does not require the file to exist (opening it reports a missing file).
// Throws FormatError "relative_path '<p>' in .metadata escapes the checkpoint folder
// '<dir>'" (or "... is not a plain relative path ..." for empty / malformed names).
std::string resolve_item_path(const std::string& checkpoint_dir, const std::string& relative_path);

}  // namespace shardpoint::format
