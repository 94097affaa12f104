// What the C API tests share: a temporary folder, result structs as their *_init leaves
// them, error messages taken (and freed), and a small checkpoint saved through sp_save.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "shardpoint/c_api.h"

namespace shardpoint::capi_test {

namespace fs = std::filesystem;

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() : path_(fs::path(::testing::TempDir()) / ("sp_c_api_" + std::to_string(::getpid()) + "_" + next())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  static std::string next() {
    static int n = 0;
    return std::to_string(n++);
  }
  fs::path path_;
};

// A result struct as its *_init leaves it (zeroed, today's struct_size).
template <typename Result>
Result sized(void (*init)(Result*)) {
  Result r;
  std::memset(&r, 0xee, sizeof r);
  init(&r);
  return r;
}

// The message of a failed call (freed), or "" when there is none.
inline std::string take(char* error) {
  std::string s = error != nullptr ? error : "";
  sp_free(error);
  return s;
}

// Saves a DCP checkpoint of two float32 tensors ("model.w" 8x4, "model.b" 4) at path.
inline void save_two_tensors(const std::string& path) {
  static float w[8][4], b[4];
  for (int i = 0; i < 32; ++i) w[i / 4][i % 4] = static_cast<float>(i);
  for (int i = 0; i < 4; ++i) b[i] = static_cast<float>(-i);
  const int64_t w_shape[2] = {8, 4}, zero[2] = {0, 0}, b_shape[1] = {4};
  const sp_tensor tensors[2] = {{"model.w", "float32", 2, w_shape, zero, w_shape, w, sizeof w},
                                {"model.b", "float32", 1, b_shape, zero, b_shape, b, sizeof b}};
  sp_checkpoint* ckpt = nullptr;
  char* error = nullptr;
  ASSERT_EQ(sp_checkpoint_open(path.c_str(), &ckpt, &error), SP_OK) << take(error);
  ASSERT_EQ(sp_save(ckpt, tensors, 2, nullptr, &error), SP_OK) << take(error);
  sp_checkpoint_close(ckpt);
}

}  // namespace shardpoint::capi_test
