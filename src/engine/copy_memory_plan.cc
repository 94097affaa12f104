#include "engine/copy_memory_plan.h"

#include <algorithm>

namespace shardpoint::engine {

constexpr std::size_t kPage = 4096;

CopyMemoryPlan plan_copy_memory(const CopyMemoryInputs& in) {
  CopyMemoryPlan plan;
  // Reserve: 5 MiB of slack for code and library pages first touched during the copy
  // (writer, CRC, checksum paths), which grow RSS after base_rss was measured; the header
  // windows; for object stores the HTTP clients' buffers.
  std::uint64_t reserve = in.base_rss + (std::uint64_t{5} << 20) + in.header_cache;
  if (in.remote_input || in.remote_output) reserve += std::uint64_t{8} << 20;
  // Of the rest, at most half the budget is used.
  std::uint64_t avail = in.budget > reserve ? in.budget - reserve : 0;
  avail = std::min<std::uint64_t>(avail, in.budget / 2);
  // A second reader costs its own scratch and allocator arena: worth it with room to spare.
  constexpr std::uint64_t kReaderCost = std::uint64_t{4} << 20;
  plan.readers = avail >= 8 * kReaderCost ? in.max_readers : 1;
  avail -= std::min<std::uint64_t>(avail, (plan.readers - 1) * kReaderCost);
  std::uint64_t for_slab = avail;
  if (in.remote_output) {
    // Upload parts: S3 needs >= 5 MiB; 8 MiB when at least two fit in a third of `avail`;
    // 1 to 4 of them.
    plan.part_bytes = avail / 3 >= (std::uint64_t{16} << 20) ? std::size_t{8} << 20 : std::size_t{5} << 20;
    std::uint64_t parts = std::clamp<std::uint64_t>(avail / 3 / plan.part_bytes, 1, 4);
    plan.pool_bytes = static_cast<std::size_t>(parts * plan.part_bytes);
    for_slab = avail > plan.pool_bytes ? avail - plan.pool_bytes : 0;
  } else {
    // Local output: 1/6 of what is available, between 64 KiB and 2 MiB.
    plan.pool_bytes = static_cast<std::size_t>(std::clamp<std::uint64_t>(avail / 6, 64 << 10, 2 << 20));
    plan.part_bytes = plan.pool_bytes;
  }
  // 2/3 of the rest for the slab (the remainder is allocator and pipeline slack).
  plan.slab_bytes = static_cast<std::size_t>(std::max<std::uint64_t>(for_slab * 2 / 3, 256 << 10));
  plan.buffer_bytes = std::max<std::size_t>(plan.slab_bytes / in.slab_buffers / kPage * kPage, kPage);
  return plan;
}

}  // namespace shardpoint::engine
