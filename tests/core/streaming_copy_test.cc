#include "core/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace shardpoint::core {
namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return v;
}

// Every size and misalignment the streaming path splits differently: below the threshold
// (memcpy), the unaligned head, whole 256-byte blocks and the tail, at each source and
// destination offset within a cache line; the bytes around the destination stay as they were.
TEST(StreamingCopyTest, CopiesEveryByteAndNothingAround) {
  const std::size_t sizes[] = {0,
                               1,
                               63,
                               64,
                               65,
                               kStreamingCopyMinBytes - 1,
                               kStreamingCopyMinBytes,
                               kStreamingCopyMinBytes + 1,
                               kStreamingCopyMinBytes + 255,
                               (std::size_t{3} << 20) + 77};
  for (std::size_t n : sizes) {
    for (std::size_t src_offset : {0, 1, 17, 63}) {
      for (std::size_t dst_offset : {0, 5, 32, 63}) {
        std::vector<unsigned char> src = pattern(n + 64, 7);
        std::vector<unsigned char> dst(n + 128, 0xAB);
        streaming_copy(dst.data() + dst_offset, src.data() + src_offset, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_offset, src.data() + src_offset, n), 0)
            << "n " << n << " src +" << src_offset << " dst +" << dst_offset;
        for (std::size_t i = 0; i < dst_offset; ++i) ASSERT_EQ(dst[i], 0xAB) << "before, n " << n;
        for (std::size_t i = dst_offset + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << "after, n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace shardpoint::core
