// replace_local_folder(): publishes a folder that was written beside its destination, so that
// replacing a committed checkpoint never has a moment where neither the old nor the new one
// is in place (a crash at any point leaves one of them whole under `target`).
//
// Thread-safety: reentrant; concurrent calls on the same paths race as rename(2) does.
#pragma once

#include <string>

namespace shardpoint::storage {

// Moves the folder `staged` to `target`:
//   1. `target` absent: rename(staged, target).
//   2. otherwise renameat2(RENAME_EXCHANGE): `target` holds the new folder and `staged` the
//      old one, in one step;
//   3. fsync of the parent folder (when durable), so the exchange survives a crash;
//   4. the old folder (now at `staged`) is removed, best effort.
// REQUIRES both on one local filesystem. Throws StorageError naming both paths when the
// rename or the exchange fails (the filesystem refuses RENAME_EXCHANGE: kOther); nothing
// has changed then.
void replace_local_folder(const std::string& staged, const std::string& target, bool durable);

}  // namespace shardpoint::storage
