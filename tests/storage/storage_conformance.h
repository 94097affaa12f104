// The conformance suite every Storage driver passes, parameterized over a
// factory that returns a fresh, empty storage per test.
//
// A driver's test file instantiates it:
//   INSTANTIATE_TEST_SUITE_P(Local, StorageConformanceTest,
//                            ::testing::Values(StorageFactory{"local", &make_local}),
//                            StorageFactoryName());
// and links storage_conformance.cc (which holds the TEST_Ps) into its test binary.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "shardpoint/storage.h"

namespace shardpoint::storage::testing {

// A storage under test plus whatever must outlive it (a temporary directory, a server).
struct StorageUnderTest {
  std::shared_ptr<Storage> storage;
  std::shared_ptr<void> keepalive;
};

struct StorageFactory {
  std::string name;
  std::function<StorageUnderTest()> make;
  // False where a key that is also a prefix of other keys cannot be asked about: s3s-fs keeps
  // objects as files, so such a key is a folder and HEAD answers 500 InternalError.
  bool prefix_keys_answer_not_found = true;
};

// So gtest prints the driver name, not the factory's bytes.
inline void PrintTo(const StorageFactory& factory, std::ostream* os) { *os << factory.name; }

struct StorageFactoryName {
  std::string operator()(const ::testing::TestParamInfo<StorageFactory>& info) const { return info.param.name; }
};

class StorageConformanceTest : public ::testing::TestWithParam<StorageFactory> {
 protected:
  void SetUp() override {
    under_test_ = GetParam().make();
    storage_ = under_test_.storage.get();
  }
  void TearDown() override { under_test_ = {}; }

  Storage& storage() { return *storage_; }

  StorageUnderTest under_test_;
  Storage* storage_ = nullptr;
};

}  // namespace shardpoint::storage::testing
