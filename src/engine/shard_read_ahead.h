// ShardReadAhead: tells the kernel which parts of a local DCP checkpoint's shard files
// will be read soon (posix_fadvise WILLNEED), so a copy that reads tensors one after the
// other on a cold page cache does not wait for the disk on each of the many small header
// reads of every blob. Blobs of one file less than 1 MiB apart are announced as one range.
//
// Best effort: a shard file that cannot be opened is skipped, advice the kernel ignores is
// lost; nothing is reported. It keeps one descriptor open per shard file it advised on
// (closed when it is destroyed).
//
// Thread-safety: advise() may be called from several threads (calls are serialised).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/unique_fd.h"
#include "shardpoint/metadata.h"
#include "shardpoint/mutex.h"

namespace shardpoint::engine {

class ShardReadAhead {
 public:
  // `md` is the checkpoint's metadata (REQUIRES it outlives this object); `folder` the
  // local folder its relative paths are under.
  ShardReadAhead(const format::Metadata& md, std::string folder);
  ShardReadAhead(const ShardReadAhead&) = delete;
  ShardReadAhead& operator=(const ShardReadAhead&) = delete;

  // Announces the saved blobs of these tensors (fqns that are not tensors of md are
  // skipped). Never throws except std::bad_alloc.
  void advise(const std::vector<std::string>& fqns);

 private:
  void advise_range(const std::string& file, std::uint64_t start, std::uint64_t end) SP_REQUIRES(mu_);

  const format::Metadata& md_;
  const std::string folder_;
  Mutex mu_;
  std::map<std::string, UniqueFd> fds_ SP_GUARDED_BY(mu_);  // one per shard file
};

}  // namespace shardpoint::engine
