#include "core/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shardpoint::core {
namespace {

using CopyFn = void (*)(char*, const char*, std::size_t);

#if defined(__x86_64__)

// Bytes up to the destination's next 64-byte boundary (streaming stores need aligned lines).
std::size_t head_bytes(const void* dst, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  return head < n ? head : n;
}

__attribute__((target("avx512f"))) void copy_avx512(char* dst, const char* src, std::size_t n) {
  std::size_t head = head_bytes(dst, n);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 256 <= n; i += 256) {
    __m512i a = _mm512_loadu_si512(src + i);
    __m512i b = _mm512_loadu_si512(src + i + 64);
    __m512i c = _mm512_loadu_si512(src + i + 128);
    __m512i d = _mm512_loadu_si512(src + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 192), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}

__attribute__((target("avx2"))) void copy_avx2(char* dst, const char* src, std::size_t n) {
  std::size_t head = head_bytes(dst, n);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}

CopyFn pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return copy_avx512;
  if (__builtin_cpu_supports("avx2")) return copy_avx2;
  return nullptr;
}
#else
CopyFn pick() { return nullptr; }  // memcpy: no streaming stores written for this architecture
#endif

}  // namespace

void streaming_copy(void* dst, const void* src, std::size_t n) {
  static const CopyFn fn = pick();
  if (fn == nullptr || n < kStreamingCopyMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  fn(static_cast<char*>(dst), static_cast<const char*>(src), n);
}

}  // namespace shardpoint::core
