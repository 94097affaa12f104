// Fuzzes TorchFile (zip + data.pkl + tensor discovery). Invariants: opening never crashes
// and throws only FormatError; every tensor's storage range lies inside the input and its
// view fits in its storage; for_each_run stays inside the storage range.
#include <cstdint>
#include <cstdlib>

#include "shardpoint/error.h"
#include "torchfile/torch_file.h"

using namespace shardpoint;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto f = torchfile::TorchFile::open(
        std::make_unique<MemorySource>(ByteSpan(reinterpret_cast<const std::byte*>(data), size), "fuzz.pt"));
    for (const torchfile::TensorInfo& t : f->tensors()) {
      if (t.storage.offset > size || t.storage.size > size - t.storage.offset) std::abort();
      if (f->tensor_of(*t.node) == nullptr) std::abort();
      if (t.numel() > (1u << 16)) continue;  // stride-0 views may repeat a tiny storage
      const std::uint64_t end = t.storage.offset + t.storage.size;
      torchfile::for_each_run(t, [&](std::uint64_t off, std::uint64_t n) {
        if (off < t.storage.offset || off > end || n > end - off) std::abort();
      });
    }
  } catch (const FormatError&) {
  }
  return 0;
}
