// How consolidate() divides its memory budget: what the process already holds, a fixed
// reserve, the output writer's staging pool and the slab of the copy pipeline
// (engine/slab_pipeline.h). A pure function of its inputs, so the split can be tested and
// reasoned about without running a copy.
//
// Thread-safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardpoint::engine {

struct CopyMemoryInputs {
  std::uint64_t budget = 0;        // the whole budget (ConsolidateOptions::memory_budget_bytes)
  std::uint64_t base_rss = 0;      // what the process holds when the copy starts
  std::uint64_t header_cache = 0;  // the input's shared header windows
  bool remote_input = false;       // read from an object store (HTTP client buffers)
  bool remote_output = false;      // written to an object store (upload parts)
  std::size_t slab_buffers = 4;    // buffers the slab is cut into
  std::size_t max_readers = 2;     // reader threads when there is room for them
};

struct CopyMemoryPlan {
  std::size_t readers = 1;       // reader threads
  std::size_t pool_bytes = 0;    // the output writer's staging pool
  std::size_t part_bytes = 0;    // one buffer of that pool (an upload part for a URL)
  std::size_t slab_bytes = 0;    // the slab (what the report calls slab_bytes)
  std::size_t buffer_bytes = 0;  // each of the slab_buffers buffers: a multiple of 4096
};

// The split (the reasons for each number are at its definition). Never fails: a budget
// too small for the reserve still gets minimum sizes (slab >= 256 KiB, pool >= 64 KiB
// locally, one 5 MiB part for a URL), so the copy may then exceed the budget.
CopyMemoryPlan plan_copy_memory(const CopyMemoryInputs& in);

}  // namespace shardpoint::engine
